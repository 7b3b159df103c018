package dev.kvshield.perf.replay;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.Reservation;
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
public class LateWriter extends TransferIncident {
    @Override
    public String name() {
        return "late-writer";
    }

    @Override
    public String description() {
        return "a request is aborted while its transfer still writes; its pages go to the next request and the late bytes land there";
    }

    @Override
    void replayStock(ReplayRig rig, Flight f) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        rig.dmaCopy(rig.prefillMemory, f.sourcePages(), rig.decodeMemory, f.destinationPages(), 0, TOKENS / 2);
        rig.decode.release(a, Owners.request(1), f.destination(), f.destination().length, true);
        rig.error(1, "aborted by the client while its transfer was still writing");
        long[] next = rig.compute(rig.decode, b, 2, TOKENS);
        rig.dmaCopy(rig.prefillMemory, f.sourcePages(), rig.decodeMemory, f.destinationPages(), TOKENS / 2, TOKENS);
        rig.prefill.release(a, Owners.request(1), f.source(), f.source().length, false);
        rig.respond(rig.decode, b, 2, next, TOKENS);
        rig.decode.release(b, Owners.request(2), next, next.length, false);
    }

    @Override
    void replayShielded(ReplayRig rig, Flight f) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        Reservation r = f.reservation();
        land(rig, r, f.sourcePages(), f.destinationPages(), 0, TOKENS / 2);
        giveUp(rig.receiver, r);
        rig.error(1, "aborted by the client while its transfer was still writing (" + r.outcome() + ")");
        rig.decode.endStep();
        long[] next = rig.compute(rig.decode, b, 2, TOKENS);
        land(rig, r, f.sourcePages(), f.destinationPages(), TOKENS / 2, TOKENS);
        rig.sender.complete(f.transfer());
        rig.receiver.acknowledge(r);
        rig.prefillPool().release(a, Owners.request(1), f.source(), 0, f.source().length, ReleaseReason.FINISHED);
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
