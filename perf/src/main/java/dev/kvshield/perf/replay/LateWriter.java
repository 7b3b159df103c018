package dev.kvshield.perf.replay;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;

/**
 * {@code late-writer} (SGLang issue 24527): tenant A's request 1 is aborted on the decode side
 * while its KV transfer is still writing; the decode side frees its pages, tenant B's request 2
 * gets them and writes its own KV, then the rest of the transfer lands on top of it, and request 2
 * decodes over tenant A's KV.
 *
 * <p>Under kvshield the aborted request's pages stay quarantined while the transfer's writer claims
 * live (until the transport's acknowledgement), so request 2 gets other pages and the late bytes
 * land only in quarantine; request 1 ends in an error.
 *
 * <p>Subclasses (planted-bug twins in tests) may change what the decode side does when it gives up
 * on a transfer.
 */
public class LateWriter implements Incident {
    static final int TOKENS = 16;

    @Override
    public String name() {
        return "late-writer";
    }

    @Override
    public String description() {
        return "a request is aborted while its transfer still writes; its pages go to the next request and the late bytes land there";
    }

    @Override
    public IncidentResult replay(Level level, PageSealerFactory sealer) {
        try (ReplayRig rig = new ReplayRig(level, sealer)) {
            rig.request();
            rig.request();
            if (level == Level.STOCK) {
                replayStock(rig);
            } else {
                replayShielded(rig);
            }
            return rig.result(name());
        }
    }

    private static void replayStock(ReplayRig rig) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        long[] src = rig.compute(rig.prefill, a, 1, TOKENS);
        long[] dst = new long[rig.pagesFor(TOKENS)];
        rig.decode.allocate(a, Owners.request(1), dst.length, dst, 0);
        int[] srcPages = ReplayRig.pages(rig.prefill, src);
        int[] dstPages = ReplayRig.pages(rig.decode, dst);
        rig.dmaCopy(rig.prefillMemory, srcPages, rig.decodeMemory, dstPages, 0, TOKENS / 2);
        rig.decode.release(a, Owners.request(1), dst, dst.length, true);
        rig.error(1, "aborted by the client while its transfer was still writing");
        long[] next = rig.compute(rig.decode, b, 2, TOKENS);
        rig.dmaCopy(rig.prefillMemory, srcPages, rig.decodeMemory, dstPages, TOKENS / 2, TOKENS);
        rig.prefill.release(a, Owners.request(1), src, src.length, false);
        rig.respond(rig.decode, b, 2, next, TOKENS);
        rig.decode.release(b, Owners.request(2), next, next.length, false);
    }

    private void replayShielded(ReplayRig rig) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        HandoffReceiver receiver = rig.receiver;
        long[] src = rig.compute(rig.prefill, a, 1, TOKENS);
        HandoffSender.Transfer transfer = rig.sender.begin(a, 1, TOKENS, src, ReplayRig.DECODE_PEER);
        Reservation r = receiver.reserve(a, 1, TOKENS, ReplayRig.PREFILL_PEER);
        int[] srcPages = ReplayRig.pages(rig.prefill, src);
        int[] dstPages = new int[r.pageCount()];
        for (int i = 0; i < dstPages.length; i++) {
            dstPages[i] = rig.decode.pageOf(r.handle(i));
        }
        land(rig, r, srcPages, dstPages, 0, TOKENS / 2);
        giveUp(receiver, r);
        rig.error(1, "aborted by the client while its transfer was still writing (" + r.outcome() + ")");
        rig.decode.endStep();
        long[] next = rig.compute(rig.decode, b, 2, TOKENS);
        land(rig, r, srcPages, dstPages, TOKENS / 2, TOKENS);
        rig.sender.complete(transfer);
        receiver.acknowledge(r);
        rig.prefillPool().release(a, Owners.request(1), src, 0, src.length, ReleaseReason.FINISHED);
        rig.respond(rig.decode, b, 2, next, TOKENS);
        rig.decode.release(b, Owners.request(2), next, next.length, false);
    }

    /** The DMA engine lands tokens, then tells the receiver which slots it wrote (refused once the claims are gone). */
    static void land(ReplayRig rig, Reservation r, int[] srcPages, int[] dstPages, int from, int to) {
        rig.dmaCopy(rig.prefillMemory, srcPages, rig.decodeMemory, dstPages, from, to);
        int pageSize = rig.geometry.pageSizeTokens();
        for (int p = from / pageSize; p * pageSize < to; p++) {
            try {
                rig.receiver.recordWritten(r, p, Math.max(from, p * pageSize) - p * pageSize, Math.min(to, (p + 1) * pageSize) - p * pageSize);
            } catch (KvShieldException e) {
                // The bytes landed anyway (a DMA engine does not ask); the bookkeeping refuses them.
            }
        }
    }

    /** The decode side stops waiting for the transfer (the client aborted). */
    protected void giveUp(HandoffReceiver receiver, Reservation r) {
        receiver.abort(r);
    }
}
