package dev.kvshield.handoff;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseIdsExhaustedException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.prefix.PrefixCache;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.PageRecords;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.function.UnaryOperator;
import java.util.stream.IntStream;
import org.junit.jupiter.api.Test;

/**
 * The handoff's share of the pre-lease defects: a committed request whose full pages the decode side
 * cached must still finish (its tail page released, nothing left held by the finished request), and
 * a reservation the lease table or the lease ids cannot hold is refused before anything moves.
 */
class HandoffHoldsDefectsTest {
    static final PoolGeometry G = TestPools.tinyGeometry(8);
    static final long PEER = 3;
    static final long REQUEST = 5;
    static final int[] TOKENS = IntStream.range(200, 210).toArray(); // two full pages and a tail of two tokens

    static TestPools decode(UnaryOperator<PoolConfig.Builder> config) {
        return TestPools.create(G, ProtectionLevel.ZERO, config, UnaryOperator.identity());
    }

    static HandoffReceiver receiver(KvPagePool pool, List<String> alarms) {
        HandoffReceiver r = new HandoffReceiver(pool, alarms::add);
        r.handshake(PEER, r.effectiveLimitTokens());
        return r;
    }

    /** The transport lands the request's KV (its pattern, page by page) through the reservation's claims. */
    static void land(HandoffReceiver receiver, Reservation r, Arena arena, int tenant) {
        for (int i = 0; i < r.pageCount(); i++) {
            int slots = (int) Math.min(G.pageSizeTokens(), r.sequenceTokens() - (long) i * G.pageSizeTokens());
            for (int b = 0; b < G.bufferCount(); b++) {
                MemorySegment page = Patterns.fill(arena, G.pageBytes(b), tenant, REQUEST, r.page(i), b);
                receiver.write(r, i, b, 0, page.asSlice(0, (long) slots * G.bytesPerToken(b)));
            }
        }
    }

    // ------------------------------------------------------------ a handoff that cannot finish

    /** How the decode side ends a committed request. */
    interface Finisher {
        void finish(HandoffReceiver receiver, KvPagePool pool, Reservation r);
    }

    static final Finisher RECEIVER = (receiver, pool, r) -> receiver.finish(r);
    /** Planted bug: the request's pages are freed by every lease the reservation was given, retried on failure. */
    static final Finisher EVERY_LEASE = (receiver, pool, r) -> {
        long[] all = IntStream.range(0, r.pageCount()).mapToLong(r::lease).toArray();
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                pool.release(r.tenant(), Owners.request(r.request()), all, 0, all.length, ReleaseReason.FINISHED);
                return;
            } catch (LeaseException e) {
                assertTrue(e.getMessage().contains("not held"), e.getMessage());
            }
        }
    };

    /**
     * A handoff of ten tokens commits; the decode side caches its two full pages and the request
     * finishes. Returns whether the oracle holds: the finished request holds nothing, its tail page
     * is protected and free after the boundary, and another request of the tenant reads the cached
     * pages' exact bytes.
     */
    static boolean aCachedHandoffFinishes(Finisher finisher) {
        try (TestPools t = decode(UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int tenant = pool.tenants().register("client");
            HandoffReceiver receiver = receiver(pool, new ArrayList<>());
            Reservation r = receiver.reserve(tenant, REQUEST, TOKENS.length, PEER);
            land(receiver, r, arena, tenant);
            receiver.acknowledge(r);
            assertTrue(receiver.commit(r, TOKENS.length).committed());
            PrefixCache cache = new PrefixCache(pool);
            assertEquals(2, cache.insert(tenant, REQUEST, TOKENS, new long[] {r.lease(0), r.lease(1)}));
            finisher.finish(receiver, pool, r);
            pool.endStep();
            int[] pages = IntStream.range(1, G.pageCount()).toArray();
            long[] held = new long[pages.length];
            boolean nothingHeld = pool.view().leasesOf(pages, 0, pages.length, tenant, Owners.request(REQUEST), LeaseKind.OWNER, held, 0) == 0;
            int tail = r.page(2);
            boolean tailFree = pool.view().stateOf(tail) == PageState.FREE && Patterns.allZero(PoolProbe.rawPage(t.memory, arena, tail));
            long[] readers = new long[2];
            assertEquals(2, cache.match(tenant, 6, TOKENS, readers));
            boolean cachedExact = true;
            for (int i = 0; i < 2; i++) {
                MemorySegment got = arena.allocate(G.pageBytes(0));
                pool.read(tenant, Owners.request(6), readers[i], 0, 0, got);
                cachedExact &= Patterns.matches(got, tenant, REQUEST, r.page(i), 0);
            }
            return nothingHeld && tailFree && cachedExact;
        }
    }

    @Test
    void aCommittedRequestWhoseFullPagesWereCachedFinishesAndFreesItsTail() {
        assertTrue(aCachedHandoffFinishes(RECEIVER));
    }

    @Test
    void plantedBugFinishingByEveryLeaseOfTheReservationLeavesTheTailHeldForever() {
        assertFalse(aCachedHandoffFinishes(EVERY_LEASE), "twin: the cached pages' dead leases refuse the release every time");
    }

    // ------------------------------------------------------------ reservations the lease table cannot hold

    /** How a reservation's pages and claims are taken. */
    interface Reserver {
        void reserve(HandoffReceiver receiver, KvPagePool pool, int tenant);
    }

    static final Reserver RECEIVER_RESERVE = (receiver, pool, tenant) -> receiver.reserve(tenant, REQUEST, 8, PEER);
    /** Planted bug: pages first, then claims; a claim refusal gives the pages back (released, not as they were). */
    static final Reserver PAGES_THEN_CLAIMS = (receiver, pool, tenant) -> {
        long[] leases = new long[2];
        assertTrue(pool.allocate(tenant, Owners.request(REQUEST), LeaseKind.RESERVATION, 2, leases, 0));
        try {
            pool.claim(tenant, Owners.request(REQUEST), leases, 0, 2, ClaimKind.WRITER, PEER, new long[2], 0);
        } catch (RuntimeException e) {
            pool.release(tenant, Owners.request(REQUEST), leases, 0, 2, ReleaseReason.REJECTED);
            throw e;
        }
    };

    /**
     * A reservation of two pages where the pool can mint three more leases ({@code idsRunOut}: the
     * lease ids end there; else the lease table is full there). Returns whether the refusal left the
     * pool exactly as it was.
     */
    static boolean reservationBeyondTheLeasesIsRefusedWhole(Reserver reserver, boolean idsRunOut) {
        long maxSerial = new LeaseIds(G.pageCount()).maxSerial();
        try (TestPools t = decode(c -> idsRunOut ? c.testingFirstLeaseSerial(maxSerial - 3) : c.maxLeases(4).maxClaims(4));
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int tenant = pool.tenants().register("client");
            HandoffReceiver receiver = receiver(pool, new ArrayList<>());
            assertTrue(pool.allocate(tenant, Owners.request(1), LeaseKind.OWNER, 1, new long[1], 0), "one lease in use");
            long digest = pool.stateDigest();
            PageRecords before = PageRecords.capture(pool, t.memory);
            RuntimeException e = assertThrows(RuntimeException.class, () -> reserver.reserve(receiver, pool, tenant));
            assertTrue(idsRunOut ? e instanceof LeaseIdsExhaustedException : e instanceof LeaseCapacityException, e.toString());
            assertEquals(0, receiver.unacknowledged());
            if (digest != pool.stateDigest()) {
                return false;
            }
            PageRecords.capture(pool, t.memory).assertSameAs(before, Set.of(), "refused reservation");
            return true;
        }
    }

    @Test
    void aReservationTheLeaseTableCannotHoldIsRefusedBeforeAPageMoves() {
        assertTrue(reservationBeyondTheLeasesIsRefusedWhole(RECEIVER_RESERVE, false));
        assertTrue(reservationBeyondTheLeasesIsRefusedWhole(RECEIVER_RESERVE, true));
    }

    @Test
    void plantedBugPagesThenClaimsReleasesThePagesInsteadOfLeavingThePoolAsItWas() {
        assertFalse(reservationBeyondTheLeasesIsRefusedWhole(PAGES_THEN_CLAIMS, false));
        assertFalse(reservationBeyondTheLeasesIsRefusedWhole(PAGES_THEN_CLAIMS, true));
    }

    // ------------------------------------------------------------ receiver calls that must change nothing

    @Test
    void receiverCallsOnAForeignUnfitOrEndedReservationChangeNothing() {
        try (TestPools t = decode(UnaryOperator.identity()); TestPools elsewhere = decode(c -> c.poolId("elsewhere"));
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int tenant = pool.tenants().register("client");
            elsewhere.pool.tenants().register("client");
            HandoffReceiver receiver = receiver(pool, new ArrayList<>());
            HandoffReceiver other = receiver(elsewhere.pool, new ArrayList<>());
            Reservation theirs = other.reserve(tenant, REQUEST, 8, PEER);
            Reservation r = receiver.reserve(tenant, REQUEST, TOKENS.length, PEER);
            land(receiver, r, arena, tenant);
            long digest = pool.stateDigest();
            List<Runnable> refused = List.of(() -> receiver.commit(theirs, 8), () -> receiver.abort(theirs),
                    () -> receiver.acknowledge(theirs), () -> receiver.expire(theirs), () -> receiver.finish(theirs),
                    () -> receiver.commit(r, -1), () -> receiver.finish(r), () -> receiver.reserve(tenant + 7, 9, 4, PEER),
                    () -> receiver.reserve(tenant, -1, 4, PEER), () -> receiver.reserve(tenant, 9, 4, PEER + 1),
                    () -> receiver.reserve(tenant, 9, Long.MAX_VALUE, PEER), () -> receiver.write(r, 3, 0, 0, arena.allocate(8)));
            for (int i = 0; i < refused.size(); i++) {
                Runnable call = refused.get(i);
                assertThrows(RuntimeException.class, call::run, "call " + i);
                assertEquals(digest, pool.stateDigest(), "call " + i + " changed the pool");
            }
            assertEquals(1, receiver.unacknowledged());
            assertTrue(receiver.commit(r, TOKENS.length).committed());
            long committed = pool.stateDigest();
            assertThrows(IllegalStateException.class, () -> receiver.commit(r, TOKENS.length), "a reservation commits once");
            assertEquals(committed, pool.stateDigest());
            receiver.finish(r);
            long finished = pool.stateDigest();
            receiver.finish(r);
            receiver.abort(r);
            assertEquals(finished, pool.stateDigest(), "a second finish or a late abort releases nothing more");
        }
    }
}
