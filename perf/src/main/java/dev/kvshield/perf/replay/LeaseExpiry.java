package dev.kvshield.perf.replay;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;

/**
 * {@code lease-expiry} (SGLang issue 38961): tenant A's request 1 finishes prefill while its KV is
 * still being read out for the handoff; its pages are held by a lease, the lease times out while the
 * reader is still reading, the pages go to tenant B's request 2, and the rest of the transfer sends
 * request 2's KV to request 1's decode, which returns it.
 *
 * <p>Under kvshield a timeout is never a free: the decode side expires the transfer (request 1
 * fails, an alarm is raised) and the source pages stay quarantined under their reader claims until
 * the transport drains, so request 2 gets other pages.
 *
 * <p>Subclasses (planted-bug twins in tests) may change what happens when the lease times out.
 */
public class LeaseExpiry implements Incident {
    static final int TOKENS = 16;

    @Override
    public String name() {
        return "lease-expiry";
    }

    @Override
    public String description() {
        return "a reader's lease on a finished request's pages expires while its transfer still reads; the pages go to another request";
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
        // The lease times out: the deferred release frees the pages although the transfer still reads.
        rig.prefill.release(a, Owners.request(1), src, src.length, false);
        long[] next = rig.compute(rig.prefill, b, 2, TOKENS);
        rig.dmaCopy(rig.prefillMemory, srcPages, rig.decodeMemory, dstPages, TOKENS / 2, TOKENS);
        rig.respond(rig.decode, a, 1, dst, TOKENS);
        rig.respond(rig.prefill, b, 2, next, TOKENS);
        rig.decode.release(a, Owners.request(1), dst, dst.length, false);
        rig.prefill.release(b, Owners.request(2), next, next.length, false);
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
        LateWriter.land(rig, r, srcPages, dstPages, 0, TOKENS / 2);
        // Prefill is done with the request: its pages are released but held by the transfer's reader claims.
        rig.prefillPool().release(a, Owners.request(1), src, 0, src.length, ReleaseReason.FINISHED);
        boolean failed = leaseTimedOut(rig.sender, transfer, receiver, r);
        rig.prefill.endStep();
        long[] next = rig.compute(rig.prefill, b, 2, TOKENS);
        LateWriter.land(rig, r, srcPages, dstPages, TOKENS / 2, TOKENS);
        rig.sender.complete(transfer);
        if (failed) {
            receiver.acknowledge(r);
            rig.error(1, "transfer expired (" + r.outcome() + "); " + rig.alarms.size() + " alarm(s) raised");
        } else {
            CommitResult c = receiver.commit(r, TOKENS);
            receiver.acknowledge(r);
            if (c.committed()) {
                long[] handles = new long[r.pageCount()];
                for (int i = 0; i < handles.length; i++) {
                    handles[i] = r.handle(i);
                }
                rig.respond(rig.decode, a, 1, handles, TOKENS);
                receiver.finish(r);
            } else {
                rig.error(1, c.message());
            }
        }
        rig.respond(rig.prefill, b, 2, next, TOKENS);
        rig.prefill.release(b, Owners.request(2), next, next.length, false);
    }

    /**
     * The lease ran out while the transfer still reads. kvshield fences: the decode side expires
     * the transfer (the request fails, an alarm is raised); the source pages keep their claims.
     *
     * @return true if the request failed
     */
    protected boolean leaseTimedOut(HandoffSender sender, HandoffSender.Transfer transfer, HandoffReceiver receiver, Reservation r) {
        receiver.expire(r);
        return true;
    }
}
