package dev.kvshield.handoff;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.admission.LimitMismatchException;
import dev.kvshield.admission.RequestTooLongException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Prefill and decode pools with a local transport. Each scenario of the 2026 incident class checks
 * the bytes the decode side would read, and has a planted-bug twin (accept partial coverage, free on
 * timeout, skip the generation check) that must leak.
 */
class HandoffTest {
    static final long PEER = 77;
    // 8 usable pages of 4 tokens: 32 token slots; both sides admit up to 24 tokens.
    static final PoolGeometry G = PoolGeometry.builder().mha(2, 1, 4, 2).pageSizeTokens(4).pageCount(9).build();
    static final AdmissionPolicy LIMIT = new AdmissionPolicy(24, 0, false);

    TestPools prefill;
    TestPools decode;
    HandoffSender sender;
    HandoffReceiver receiver;
    List<String> alarms = new ArrayList<>();
    Arena arena;
    int victim;
    int tenant;

    /** Decode pool at NONE: the strongest test of the guards, since no scrub hides a mistake. */
    @BeforeEach
    void setUp() {
        prefill = TestPools.create(G, ProtectionLevel.NONE, c -> c.admission(LIMIT).poolId("prefill"), UnaryOperator.identity());
        decode = TestPools.create(G, ProtectionLevel.NONE, c -> c.admission(LIMIT).poolId("decode"), UnaryOperator.identity());
        sender = new HandoffSender(prefill.pool);
        receiver = new HandoffReceiver(decode.pool, alarms::add);
        sender.handshake(PEER, receiver.effectiveLimitTokens());
        receiver.handshake(PEER, sender.effectiveLimitTokens());
        arena = Arena.ofConfined();
        victim = decode.pool.tenants().register("victim");
        tenant = decode.pool.tenants().register("client");
        prefill.pool.tenants().register("victim");
        prefill.pool.tenants().register("client");
        leaveVictimDataInEveryDecodePage();
    }

    @AfterEach
    void tearDown() {
        arena.close();
        prefill.close();
        decode.close();
    }

    /** An earlier request of another tenant filled every decode page and finished (NONE leaves its bytes). */
    private void leaveVictimDataInEveryDecodePage() {
        KvPagePool pool = decode.pool;
        long[] h = new long[G.usablePages()];
        assertTrue(pool.allocate(victim, Owners.request(1), LeaseKind.OWNER, h.length, h, 0));
        for (long handle : h) {
            writeWholePage(pool, victim, 1, handle);
        }
        pool.release(victim, Owners.request(1), h, 0, h.length, ReleaseReason.FINISHED);
        pool.endStep();
    }

    private void writeWholePage(KvPagePool pool, int t, long request, long handle) {
        for (int b = 0; b < G.bufferCount(); b++) {
            pool.write(t, Owners.request(request), handle, b, 0, Patterns.fill(arena, G.pageBytes(b), t, request, pool.view().pageOf(handle), b));
        }
    }

    /** The client's prompt KV on the prefill side. */
    private long[] prefillRequest(long request, long tokens) {
        long[] h = new long[(int) ((tokens + 3) / 4)];
        assertTrue(prefill.pool.allocate(tenant, Owners.request(request), LeaseKind.OWNER, h.length, h, 0));
        for (long handle : h) {
            writeWholePage(prefill.pool, tenant, request, handle);
        }
        return h;
    }

    /** What a decode kernel reading the reservation's raw pages would get: true if any victim byte shows. */
    private boolean decodeSeesVictimBytes(Reservation r) {
        for (int i = 0; i < r.pageCount(); i++) {
            if (PoolProbe.holdsPattern(decode.memory, arena, r.page(i), victim, 1)) {
                return true;
            }
        }
        return false;
    }

    @Test
    void aFullTransferCommitsAndDecodeReadsExactlyThePrefillBytes() {
        long[] src = prefillRequest(5, 16);
        HandoffSender.Transfer t = sender.begin(tenant, 5, 16, src, PEER);
        Reservation r = receiver.reserve(tenant, 5, 16, PEER);
        LocalTransport.copy(sender, t, receiver, r, G, 16);
        CommitResult c = receiver.commit(r, t.sentTokens());
        assertTrue(c.committed(), c.message());
        for (int i = 0; i < r.pageCount(); i++) {
            for (int b = 0; b < G.bufferCount(); b++) {
                MemorySegment got = arena.allocate(G.pageBytes(b));
                decode.pool.read(tenant, Owners.request(5), r.lease(i), b, 0, got);
                assertTrue(Patterns.matches(got, tenant, 5, prefill.pool.view().pageOf(src[i]), b), "page " + i + " buffer " + b);
            }
        }
        sender.complete(t);
        receiver.acknowledge(r);
        receiver.finish(r);
        assertEquals(0, receiver.unacknowledged());
        assertEquals(1.0, receiver.outcomeCount(HandoffOutcome.COMMITTED));
    }

    @Test
    void anOversizedRequestNeverStartsAHandoffOnEitherSide() {
        long prefillDigest = prefill.pool.stateDigest();
        long decodeDigest = decode.pool.stateDigest();
        RequestTooLongException e = assertThrows(RequestTooLongException.class, () -> sender.begin(tenant, 6, 30, new long[8], PEER));
        assertEquals("request of 30 tokens exceeds the effective limit of 24 tokens (advertised 24)", e.getMessage());
        assertThrows(RequestTooLongException.class, () -> receiver.reserve(tenant, 6, 30, PEER));
        assertEquals(prefillDigest, prefill.pool.stateDigest());
        assertEquals(decodeDigest, decode.pool.stateDigest(), "nothing reserved on decode");
    }

    @Test
    void plantedBugTheIncidentPathLeaksWhenPartialCoverageIsAccepted() {
        // The 2026 path: the prompt was shrunk to a one-token placeholder and sent anyway; decode
        // reserved pages for the full prompt and read them all.
        long[] src = prefillRequest(7, 1);
        HandoffSender.Transfer t = sender.begin(tenant, 7, 1, src, PEER);
        Reservation r = receiver.reserve(tenant, 7, 20, PEER);
        LocalTransport.copy(sender, t, receiver, r, G, 1);
        CommitResult c = receiver.commit(r, t.sentTokens());
        assertEquals(HandoffOutcome.REFUSED_COVERAGE, c.outcome());
        assertTrue(c.outcome().failsRequest());
        assertEquals("handoff refused: sender covered 1 of 20 tokens of request 7", c.message());
        assertThrows(dev.kvshield.lease.ReleasedLeaseException.class,
                () -> decode.pool.read(tenant, Owners.request(7), r.lease(1), 0, 0, arena.allocate(G.pageBytes(0))),
                "refused pages are released: no read possible");
        // Twin: a decode side that accepts partial coverage reads what the reserved pages hold.
        assertTrue(decodeSeesVictimBytes(r), "accepting the partial handoff would have served the victim's bytes");
    }

    @Test
    void onePageWrittenOfManyIsRefusedEvenWithFullPublishedCoverage() {
        long[] src = prefillRequest(8, 12);
        HandoffSender.Transfer t = sender.begin(tenant, 8, 12, src, PEER);
        Reservation r = receiver.reserve(tenant, 8, 12, PEER);
        LocalTransport.copy(sender, t, receiver, r, G, 4); // only page 0 lands
        CommitResult c = receiver.commit(r, 12); // a sender that claims more than it sent
        assertEquals(HandoffOutcome.REFUSED_UNWRITTEN, c.outcome());
        assertEquals(1, c.firstBadPage());
        assertTrue(decodeSeesVictimBytes(r), "twin: committing would have served the victim's bytes from pages 1-2");
    }

    @Test
    void theGuardsAloneStopAReadOfUnwrittenSlots() {
        long[] src = prefillRequest(9, 4);
        HandoffSender.Transfer t = sender.begin(tenant, 9, 4, src, PEER);
        Reservation r = receiver.reserve(tenant, 9, 8, PEER);
        LocalTransport.copy(sender, t, receiver, r, G, 4);
        // Even before commit decides, the written extent refuses page 1's unwritten slots.
        assertThrows(ReadBeforeWriteException.class,
                () -> decode.pool.read(tenant, Owners.request(9), r.lease(1), 0, 0, arena.allocate(G.pageBytes(0))));
        assertFalse(receiver.commit(r, 4).committed());
    }

    @Test
    void anAbortedRequestsLateWriteNeverLandsInAnotherRequestsPages() {
        long[] src = prefillRequest(10, 8);
        HandoffSender.Transfer t = sender.begin(tenant, 10, 8, src, PEER);
        Reservation r = receiver.reserve(tenant, 10, 8, PEER);
        receiver.abort(r);
        decode.pool.endStep();
        // The next request takes every page it can get.
        int other = decode.pool.tenants().register("other");
        long[] next = new long[G.usablePages()];
        int got = 0;
        while (got < next.length && decode.pool.allocate(other, Owners.request(11), LeaseKind.OWNER, 1, next, got)) {
            got++;
        }
        assertEquals(G.usablePages() - r.pageCount(), got, "the aborted request's pages are held back");
        for (int i = 0; i < got; i++) {
            for (int p = 0; p < r.pageCount(); p++) {
                assertFalse(decode.pool.view().pageOf(next[i]) == r.page(p));
            }
        }
        LocalTransport.copy(sender, t, receiver, r, G, 8); // the late transfer lands
        for (int i = 0; i < r.pageCount(); i++) {
            assertEquals(PageState.QUARANTINED, decode.pool.view().stateOf(r.page(i)));
        }
        sender.complete(t);
        receiver.acknowledge(r);
        decode.pool.endStep();
        assertEquals(r.pageCount(), decode.pool.available(), "drained on the acknowledgement, not before");
    }

    @Test
    void plantedBugFreeOnAbortLetsTheLateWriteLandInTheNextOwnersPage() {
        long[] src = prefillRequest(12, 4);
        HandoffSender.Transfer t = sender.begin(tenant, 12, 4, src, PEER);
        Reservation r = receiver.reserve(tenant, 12, 4, PEER);
        int page = r.page(0);
        // Twin: treat the abort as "transfer over" (drop the claims without the transport's evidence).
        receiver.abort(r);
        receiver.acknowledge(r);
        decode.pool.endStep();
        int other = decode.pool.tenants().register("other");
        long[] next = new long[1];
        assertTrue(decode.pool.allocate(other, Owners.request(13), LeaseKind.OWNER, 1, next, 0));
        assertEquals(page, decode.pool.view().pageOf(next[0]), "LIFO reuse hands the page straight to the next request");
        // The late transfer cannot write through the dropped claim any more...
        assertThrows(dev.kvshield.lease.ReleasedLeaseException.class, () -> LocalTransport.copy(sender, t, receiver, r, G, 4));
        // ...but a DMA engine does not ask: its bytes land in the next owner's page. That is the leak claims prevent.
        MemorySegment lateBytes = arena.allocate(G.pageBytes(0));
        prefill.memory.read(prefill.pool.view().pageOf(src[0]), 0, 0, lateBytes);
        decode.memory.write(page, 0, 0, lateBytes);
        MemorySegment seen = arena.allocate(G.pageBytes(0));
        decode.memory.read(page, 0, 0, seen);
        assertTrue(Patterns.matches(seen, tenant, 12, prefill.pool.view().pageOf(src[0]), 0), "the next owner now holds another request's KV");
    }

    @Test
    void aLostAcknowledgementKeepsPagesQuarantinedRaisesAnAlarmAndAppliesBackPressure() {
        long[] src = prefillRequest(14, 16);
        HandoffSender.Transfer t = sender.begin(tenant, 14, 16, src, PEER);
        Reservation r = receiver.reserve(tenant, 14, 16, PEER);
        int before = decode.pool.available();
        receiver.expire(r);
        assertEquals(1, alarms.size());
        assertTrue(alarms.get(0).contains("never acknowledged"), alarms.get(0));
        assertEquals(HandoffOutcome.EXPIRED, r.outcome());
        for (int step = 0; step < 5; step++) {
            decode.pool.endStep();
        }
        assertEquals(before, decode.pool.available(), "expired pages do not come back on a timer");
        assertEquals(r.pageCount(), decode.pool.snapshot().awaitingClaims());
        assertThrows(FencedLeaseException.class, () -> LocalTransport.copy(sender, t, receiver, r, G, 16), "late writes fail");
        assertNull(receiver.reserve(tenant, 15, 24, PEER), "back-pressure: a request that needs those pages waits");
        assertTrue(decode.pool.lastShortfall().contains("awaitingClaims=" + r.pageCount()), decode.pool.lastShortfall());
        assertEquals(1, receiver.unacknowledged());
        receiver.acknowledge(r); // the transport finally reports the transfer drained
        decode.pool.endStep();
        assertEquals(before + r.pageCount(), decode.pool.available());
    }

    @Test
    void plantedBugSkippingTheGenerationCheckCommitsOnPagesThatMovedOn() {
        long[] src = prefillRequest(16, 4);
        HandoffSender.Transfer t = sender.begin(tenant, 16, 4, src, PEER);
        Reservation r = receiver.reserve(tenant, 16, 4, PEER);
        LocalTransport.copy(sender, t, receiver, r, G, 4);
        // The reserved page is released and handed to someone else before the commit.
        decode.pool.release(tenant, Owners.request(16), new long[] {r.lease(0)}, 0, 1, ReleaseReason.ABORTED);
        CommitResult c = receiver.commit(r, 4);
        assertEquals(HandoffOutcome.REFUSED_UNWRITTEN, c.outcome(), "the page is no longer in the reserved generation");
        // Twin: a check that looks only at what the claim wrote, not at the generation, would commit.
        assertTrue(decode.pool.claimWrote(r.claim(0), 0, 4));
    }

    @Test
    void mismatchedLimitsRefuseTheHandshakeNamingBoth() {
        try (TestPools bigger = TestPools.create(G, ProtectionLevel.ZERO, c -> c.admission(new AdmissionPolicy(28, 0, false)),
                UnaryOperator.identity())) {
            HandoffReceiver other = new HandoffReceiver(bigger.pool, alarms::add);
            LimitMismatchException e = assertThrows(LimitMismatchException.class, () -> sender.handshake(99, other.effectiveLimitTokens()));
            assertEquals("effective request limits disagree: local 24 tokens, peer 28 tokens", e.getMessage());
            IllegalStateException noHandshake = assertThrows(IllegalStateException.class,
                    () -> sender.begin(tenant, 20, 4, prefillRequest(20, 4), 99));
            assertTrue(noHandshake.getMessage().contains("no handshake with peer 99"));
        }
    }

    @Test
    void anAcknowledgementBeforeCommitKeepsTheEvidence() {
        long[] src = prefillRequest(21, 8);
        HandoffSender.Transfer t = sender.begin(tenant, 21, 8, src, PEER);
        Reservation full = receiver.reserve(tenant, 21, 8, PEER);
        LocalTransport.copy(sender, t, receiver, full, G, 8);
        receiver.acknowledge(full); // the transport reported "done" first, as engines do
        assertTrue(receiver.commit(full, 8).committed());
        long[] src2 = prefillRequest(22, 8);
        HandoffSender.Transfer t2 = sender.begin(tenant, 22, 8, src2, PEER);
        Reservation half = receiver.reserve(tenant, 22, 8, PEER);
        LocalTransport.copy(sender, t2, receiver, half, G, 4);
        receiver.acknowledge(half);
        CommitResult c = receiver.commit(half, 8);
        assertEquals(HandoffOutcome.REFUSED_UNWRITTEN, c.outcome());
        assertEquals(1, c.firstBadPage());
    }

    @Test
    void aReservationOrTransferOfAnotherPoolIsRefused() {
        try (TestPools other = TestPools.create(G, ProtectionLevel.NONE, c -> c.admission(LIMIT).poolId("other"), UnaryOperator.identity())) {
            other.pool.tenants().register("victim");
            other.pool.tenants().register("client");
            HandoffReceiver otherReceiver = new HandoffReceiver(other.pool, alarms::add);
            otherReceiver.handshake(PEER, sender.effectiveLimitTokens());
            Reservation r = receiver.reserve(tenant, 23, 4, PEER);
            long digest = other.pool.stateDigest();
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> otherReceiver.commit(r, 4));
            assertTrue(e.getMessage().contains("belongs to another receiver"), e.getMessage());
            assertThrows(IllegalArgumentException.class, () -> otherReceiver.acknowledge(r));
            assertThrows(IllegalArgumentException.class, () -> otherReceiver.write(r, 0, 0, 0, arena.allocate(G.bytesPerToken(0))));
            assertEquals(digest, other.pool.stateDigest());
            HandoffSender otherSender = new HandoffSender(other.pool);
            HandoffSender.Transfer t = sender.begin(tenant, 24, 4, prefillRequest(24, 4), PEER);
            assertThrows(IllegalArgumentException.class, () -> otherSender.complete(t));
        }
    }

    /**
     * The same class in a handoff: a transfer that landed only buffer 0 of every page must not commit
     * (its other buffers hold whatever the pages' previous owners left); one that landed every
     * buffer, one buffer at a time, commits and reads back its own bytes in each.
     */
    @Test
    void aHandoffCommitsOnlyWhatEveryBufferReceived() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(8);
        for (boolean everyBuffer : new boolean[] {false, true}) {
            try (TestPools p = TestPools.create(g, ProtectionLevel.NONE, c -> c, m -> m);
                    java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
                KvPagePool pool = p.pool;
                int tenant = pool.tenants().register("client");
                dev.kvshield.handoff.HandoffReceiver receiver = new dev.kvshield.handoff.HandoffReceiver(pool, a -> { });
                receiver.handshake(3, receiver.effectiveLimitTokens());
                dev.kvshield.handoff.Reservation r = receiver.reserve(tenant, 5, 2L * g.pageSizeTokens(), 3);
                for (int i = 0; i < r.pageCount(); i++) {
                    for (int b = 0; b < (everyBuffer ? g.bufferCount() : 1); b++) {
                        receiver.write(r, i, b, 0, arena.allocate(g.pageBytes(b)).fill((byte) (0x10 + b)));
                    }
                }
                receiver.acknowledge(r);
                boolean committed = receiver.commit(r, r.sequenceTokens()).committed();
                assertEquals(everyBuffer, committed, everyBuffer ? "a transfer of every buffer did not commit"
                        : "a transfer that landed only buffer 0 committed: its other buffers were never received");
                if (committed) {
                    java.lang.foreign.MemorySegment got = arena.allocate(g.bytesPerToken(1));
                    pool.read(tenant, Owners.request(5), r.lease(0), 1, 0, got);
                    assertEquals((byte) 0x11, got.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0));
                }
            }
        }
    }
}
