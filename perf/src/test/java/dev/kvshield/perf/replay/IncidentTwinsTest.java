package dev.kvshield.perf.replay;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.perf.simulate.Level;
import org.junit.jupiter.api.Test;

/**
 * Planted-bug twins of the leak oracle on the incident replays, each under NONE (no scrub, so only
 * the guard stands between the residue and the reader): remove one guard and the oracle must fire;
 * keep it and the oracle stays at zero.
 */
class IncidentTwinsTest {
    /** A transfer cut short within the limit (admission has nothing to refuse): only the commit check stands. */
    static final int CUT_SHORT_TOKENS = 24;

    /** Twin: the decode side accepts a partial handoff as complete (and so believes every slot arrived). */
    static final class AcceptsPartialHandoff extends OversizedHandoff {
        AcceptsPartialHandoff() {
            super(CUT_SHORT_TOKENS, 1);
        }

        @Override
        protected CommitResult commit(HandoffReceiver receiver, Reservation r, long coveredTokens) {
            int pageSize = 4;
            for (int i = 0; i < r.pageCount(); i++) {
                receiver.recordWritten(r, i, 0, (int) Math.min(pageSize, r.sequenceTokens() - (long) i * pageSize));
            }
            return receiver.commit(r, r.sequenceTokens());
        }
    }

    static final class CutShort extends OversizedHandoff {
        CutShort() {
            super(CUT_SHORT_TOKENS, 1);
        }
    }

    @Test
    void partialHandoffAcceptedLeaksAndTheCommitCheckStopsIt() {
        IncidentResult twin = new AcceptsPartialHandoff().replay(Level.NONE, null);
        assertTrue(twin.leakedResponses() > 0, "accepting a partial handoff must make the leak oracle fire: " + twin);
        IncidentResult guarded = new CutShort().replay(Level.NONE, null);
        assertEquals(0, guarded.leakedResponses(), guarded.toString());
        assertTrue(guarded.outcomes().get("request 2").contains("handoff refused: sender covered 1 of 24 tokens"), guarded.toString());
    }

    /** Twin: giving up on a transfer frees its pages at once (the claim dropped on a timeout, not on the transport's evidence). */
    static final class FreesOnGiveUp extends LateWriter {
        @Override
        protected void giveUp(HandoffReceiver receiver, Reservation r) {
            receiver.abort(r);
            receiver.acknowledge(r);
        }
    }

    @Test
    void claimFreedOnAbortLetsTheLateWriteLandInTheNextRequest() {
        IncidentResult twin = new FreesOnGiveUp().replay(Level.NONE, null);
        assertTrue(twin.leakedResponses() > 0, "freeing the claimed pages must make the leak oracle fire: " + twin);
        assertEquals(ReplayRig.TENANT_A, twin.firstLeak().fromTenant());
        assertEquals(ReplayRig.TENANT_B, twin.firstLeak().toTenant());
    }

    /** Twin: a lease timeout frees the source pages (drops the reader claims) and the transfer carries on. */
    static final class FreesOnLeaseTimeout extends LeaseExpiry {
        @Override
        protected boolean leaseTimedOut(HandoffSender sender, HandoffSender.Transfer transfer, HandoffReceiver receiver, Reservation r) {
            sender.complete(transfer);
            return false;
        }
    }

    @Test
    void claimFreedOnTimeoutSendsAnotherTenantsKvToTheReader() {
        IncidentResult twin = new FreesOnLeaseTimeout().replay(Level.NONE, null);
        assertTrue(twin.leakedResponses() > 0, "freeing on timeout must make the leak oracle fire: " + twin);
        assertEquals(ReplayRig.TENANT_B, twin.firstLeak().fromTenant());
        assertEquals(ReplayRig.TENANT_A, twin.firstLeak().toTenant());
    }
}
