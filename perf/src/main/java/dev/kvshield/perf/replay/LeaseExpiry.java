package dev.kvshield.perf.replay;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
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
public class LeaseExpiry extends TransferIncident {
    @Override
    public String name() {
        return "lease-expiry";
    }

    @Override
    public String description() {
        return "a reader's lease on a finished request's pages expires while its transfer still reads; the pages go to another request";
    }

    @Override
    void replayStock(ReplayRig rig, Flight f) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        rig.dmaCopy(rig.prefillMemory, f.sourcePages(), rig.decodeMemory, f.destinationPages(), 0, TOKENS / 2);
        // The lease times out: the deferred release frees the pages although the transfer still reads.
        rig.prefill.release(a, Owners.request(1), f.source(), f.source().length, false);
        long[] next = rig.compute(rig.prefill, b, 2, TOKENS);
        rig.dmaCopy(rig.prefillMemory, f.sourcePages(), rig.decodeMemory, f.destinationPages(), TOKENS / 2, TOKENS);
        rig.respond(rig.decode, a, 1, f.destination(), TOKENS);
        rig.respond(rig.prefill, b, 2, next, TOKENS);
        rig.decode.release(a, Owners.request(1), f.destination(), f.destination().length, false);
        rig.prefill.release(b, Owners.request(2), next, next.length, false);
    }

    @Override
    void replayShielded(ReplayRig rig, Flight f) {
        int a = ReplayRig.TENANT_A;
        int b = ReplayRig.TENANT_B;
        HandoffReceiver receiver = rig.receiver;
        Reservation r = f.reservation();
        LateWriter.land(rig, r, f.sourcePages(), f.destinationPages(), 0, TOKENS / 2);
        // Prefill is done with the request: its pages are released but held by the transfer's reader claims.
        rig.prefillPool().release(a, Owners.request(1), f.source(), 0, f.source().length, ReleaseReason.FINISHED);
        boolean failed = leaseTimedOut(rig.sender, f.transfer(), receiver, r);
        rig.prefill.endStep();
        long[] next = rig.compute(rig.prefill, b, 2, TOKENS);
        LateWriter.land(rig, r, f.sourcePages(), f.destinationPages(), TOKENS / 2, TOKENS);
        rig.sender.complete(f.transfer());
        if (failed) {
            receiver.acknowledge(r);
            rig.error(1, "transfer expired (" + r.outcome() + "); " + rig.alarms.size() + " alarm(s) raised");
        } else {
            CommitResult c = receiver.commit(r, TOKENS);
            receiver.acknowledge(r);
            if (c.committed()) {
                rig.respond(rig.decode, a, 1, ReplayRig.leasesOf(r), TOKENS);
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
