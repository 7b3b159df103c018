package dev.kvshield.prefix;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.lease.UnknownLeaseException;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.EpochSealer;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PageRecords;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Set;
import java.util.function.UnaryOperator;
import java.util.stream.IntStream;
import org.junit.jupiter.api.Test;

/**
 * The prefix cache's share of the pre-lease defects: reader counts that underflow (an unmatch by a
 * request that never matched, or twice) and inserts and matches that apply part of a batch. Oracles
 * read the bytes a live reader gets and the page's owners; each has a planted-bug twin.
 */
class PrefixHoldsDefectsTest {
    static final PoolGeometry G = TestPools.tinyGeometry(8);
    static final int[] PROMPT = IntStream.range(100, 112).toArray(); // three full pages of four tokens
    static final long NAMESPACE = Owners.namespace(0);

    static TestPools pool(ProtectionLevel level, UnaryOperator<PoolConfig.Builder> config) {
        return TestPools.create(G, level, c -> config.apply(c.sealer(ctx -> new EpochSealer(ctx.memory()))), UnaryOperator.identity());
    }

    /** A request of {@code tenant} computes the prompt's three pages (pattern of request 0) and finishes into the cache. */
    static long[] computeAndCache(KvPagePool pool, Arena arena, PrefixCache cache, int tenant, long request) {
        long[] h = Leases.allocateWritten(pool, arena, tenant, Owners.request(request), 3, 0);
        int[] pages = IntStream.range(0, 3).map(i -> pool.view().pageOf(h[i])).toArray();
        assertEquals(3, cache.insert(tenant, request, PROMPT, h));
        return IntStream.range(0, 3).mapToLong(i -> pool.view().leaseOf(pages[i], tenant, NAMESPACE, LeaseKind.NAMESPACE)).toArray();
    }

    static boolean readsPrompt(KvPagePool pool, Arena arena, int tenant, long request, long reader) {
        if (!pool.view().isLive(reader)) {
            return false;
        }
        MemorySegment got = arena.allocate(G.pageBytes(0));
        pool.read(tenant, Owners.request(request), reader, 0, 0, got);
        return Patterns.matches(got, tenant, 0, pool.view().pageOf(reader), 0);
    }

    // ------------------------------------------------------------ reader counts that underflow

    /** How the engine's adapter tells the cache a request stopped reading. */
    interface Unmatcher {
        void unmatch(PrefixCache cache, KvPagePool pool, int tenant, long request, long[] readers);
    }

    static final Unmatcher BY_LEASE = (cache, pool, tenant, request, readers) -> cache.unmatch(tenant, request, readers, readers.length);
    /**
     * Planted bug: the old reader count. Each page loses one reader, whichever request it was (the
     * adapter finds a reader hold on the page and presents it as its holder).
     */
    static final Unmatcher COUNTED = (cache, pool, tenant, request, readers) -> {
        for (long r : readers) {
            int page = pool.view().pageOf(r);
            for (long q = 1; q < 10; q++) {
                long any = pool.view().leaseOf(page, tenant, Owners.request(q), LeaseKind.READER);
                if (any != LeaseIds.NONE) {
                    pool.release(tenant, Owners.request(q), new long[] {any}, 0, 1, ReleaseReason.FINISHED);
                    break;
                }
            }
        }
    };

    /**
     * Requests 1 and 2 of tenant a read the cached prompt; request 3, which never matched, unmatches
     * 2's readers; request 1 unmatches twice. The cache then evicts what it can and tenant b takes
     * every free page. Returns whether request 2 still reads the prompt from pages tenant a holds.
     */
    static boolean liveReaderSurvivesUnderflows(Unmatcher unmatcher) {
        try (TestPools t = pool(ProtectionLevel.ZERO, UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            PrefixCache cache = new PrefixCache(pool);
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            computeAndCache(pool, arena, cache, a, 9);
            long[] r1 = new long[3];
            long[] r2 = new long[3];
            assertEquals(3, cache.match(a, 1, PROMPT, r1));
            assertEquals(3, cache.match(a, 2, PROMPT, r2));
            try {
                unmatcher.unmatch(cache, pool, a, 3, r2);
            } catch (ForeignLeaseException e) {
                assertTrue(e.getMessage().contains("not by tenant 0 request 3"), e.getMessage());
            }
            unmatcher.unmatch(cache, pool, a, 1, r1);
            try {
                unmatcher.unmatch(cache, pool, a, 1, r1);
            } catch (ReleasedLeaseException e) {
                assertTrue(e.getMessage().contains("not held"), e.getMessage());
            }
            cache.evict(3);
            pool.endStep();
            long[] all = new long[G.usablePages()];
            int free = pool.available();
            assertTrue(pool.allocate(b, Owners.request(7), LeaseKind.OWNER, free, all, 0));
            for (int i = 0; i < free; i++) {
                Leases.fillPage(pool, arena, b, Owners.request(7), all[i], 7);
            }
            for (long reader : r2) {
                int page = pool.view().pageOf(reader);
                if (!readsPrompt(pool, arena, a, 2, reader) || pool.view().tenantOf(page) != a || pool.view().contentHolds(page) != 2) {
                    return false;
                }
            }
            return true;
        }
    }

    @Test
    void unmatchesByARequestThatNeverMatchedOrTwiceNeverEndAnotherRequestsRead() {
        assertTrue(liveReaderSurvivesUnderflows(BY_LEASE));
    }

    @Test
    void plantedBugACountedUnmatchLetsEvictionHandALiveReadersPageToAnotherTenant() {
        assertFalse(liveReaderSurvivesUnderflows(COUNTED), "twin: request 2's pages were evicted and went to tenant b");
    }

    // ------------------------------------------------------------ inserts that apply part of the batch

    /** How the adapter moves a finished request's pages into the cache namespace. */
    interface Inserter {
        void insert(PrefixCache cache, KvPagePool pool, int tenant, long request, long[] leases);
    }

    static final Inserter WHOLE = (cache, pool, tenant, request, leases) -> cache.insert(tenant, request, PROMPT, leases);
    /** Planted bug: ownership moves block by block, so a bad block leaves the blocks before it moved. */
    static final Inserter BLOCK_BY_BLOCK = (cache, pool, tenant, request, leases) -> {
        for (int i = 0; i < leases.length; i++) {
            pool.transfer(tenant, Owners.request(request), leases, i, 1, LeaseKind.NAMESPACE, NAMESPACE, new long[1], 0);
        }
    };

    /**
     * A finished request presents three blocks of which block {@code bad} is a bad lease ({@code
     * kind}: 0 released, 1 another tenant's, 2 another block's lease again, 3 never minted). Returns
     * how many of its pages changed hands.
     */
    static int pagesMovedByABadInsert(Inserter inserter, int bad, int kind) {
        try (TestPools t = pool(ProtectionLevel.ZERO, UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            PrefixCache cache = new PrefixCache(pool);
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = Leases.allocateWritten(pool, arena, a, Owners.request(1), 3, 0);
            long[] other = Leases.allocateWritten(pool, arena, b, Owners.request(1), 1, 0);
            long[] spare = Leases.allocateWritten(pool, arena, a, Owners.request(1), 1, 0);
            pool.release(a, Owners.request(1), spare, 0, 1, ReleaseReason.FINISHED);
            long[] presented = h.clone();
            presented[bad] = switch (kind) {
                case 0 -> spare[0];
                case 1 -> other[0];
                case 2 -> h[(bad + 1) % 3];
                default -> pool.view().leaseIds().encode(1L << 20, pool.view().pageOf(h[bad]));
            };
            long digest = pool.stateDigest();
            PageRecords before = PageRecords.capture(pool, t.memory);
            if (kind == 3) {
                assertThrows(UnknownLeaseException.class, () -> pool.checkHeld(a, Owners.request(1), presented, 0, 3));
            }
            assertThrows(KvShieldException.class, () -> inserter.insert(cache, pool, a, 1, presented));
            if (pool.stateDigest() == digest) {
                PageRecords.capture(pool, t.memory).assertSameAs(before, Set.of(), "bad block " + bad);
                assertEquals(0, cache.size());
                return 0;
            }
            return (int) IntStream.range(0, 3).filter(i -> !pool.view().isLive(h[i])).count();
        }
    }

    @Test
    void anInsertWithABadBlockMovesNoPageWhereverTheBadBlockIs() {
        for (int bad = 0; bad < 3; bad++) {
            for (int kind = 0; kind < 4; kind++) {
                assertEquals(0, pagesMovedByABadInsert(WHOLE, bad, kind), "bad block " + bad + " kind " + kind);
            }
        }
    }

    @Test
    void plantedBugABlockByBlockInsertMovesTheBlocksBeforeTheBadOne() {
        for (int bad = 0; bad < 3; bad++) {
            for (int kind = 0; kind < 4; kind++) {
                // Every block before the bad one moved (a duplicate of a later block moves that one too).
                assertEquals(bad > 0 || kind == 2, pagesMovedByABadInsert(BLOCK_BY_BLOCK, bad, kind) > 0,
                        "twin: bad block " + bad + " kind " + kind);
            }
        }
    }

    // ------------------------------------------------------------ matches that apply part of the batch

    /** How a request's prefix hit reaches the pool. */
    interface Matcher {
        void match(PrefixCache cache, KvPagePool pool, int tenant, long request, long sealedRef, long[] resident);
    }

    static final Matcher THROUGH_THE_CACHE = (cache, pool, tenant, request, sealedRef, resident) -> cache.match(tenant, request,
            PROMPT, new long[3]);
    /** Planted bug: the sealed block is reclaimed, then the run is shared, each refusal found only when its call runs. */
    static final Matcher RECLAIM_THEN_SHARE = (cache, pool, tenant, request, sealedRef, resident) -> {
        long[] back = new long[1];
        assertEquals(1, pool.reclaim(tenant, NAMESPACE, LeaseKind.NAMESPACE, new long[] {sealedRef}, 0, 1, back, 0));
        long[] run = java.util.stream.LongStream.concat(java.util.Arrays.stream(resident), java.util.Arrays.stream(back)).toArray();
        pool.share(tenant, NAMESPACE, run, 0, run.length, LeaseKind.READER, tenant, Owners.request(request), new long[3], 0);
    };

    /**
     * Tenant a's prompt is cached and one block evicted into a sealed page; then a match that must
     * be refused runs ({@code refusal}: 0 a request id that is not one, 1 a request that already
     * reads the resident blocks, 2 more readers than the lease table holds). Returns whether the
     * refused match left the pool as it was, the sealed block still sealed.
     */
    static boolean refusedMatchAfterASealedBlock(Matcher matcher, int refusal) {
        try (TestPools t = pool(ProtectionLevel.ENCRYPT, c -> refusal == 2 ? c.maxLeases(6) : c); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            PrefixCache cache = new PrefixCache(pool);
            int a = pool.tenants().register("a");
            long[] cached = computeAndCache(pool, arena, cache, a, 9);
            long[] handles = Leases.handles(pool, cached);
            long request = refusal == 0 ? -1 : 2;
            if (refusal == 1) {
                assertEquals(2, cache.match(a, 2, java.util.Arrays.copyOf(PROMPT, 8), new long[3]), "request 2 reads blocks 0 and 1");
            }
            if (refusal == 2) {
                assertTrue(pool.allocate(a, Owners.request(8), LeaseKind.OWNER, 2, new long[2], 0), "leases: 3 namespace + 2 filler");
            }
            assertEquals(1, cache.evict(1), "the least recently used block no one reads is sealed");
            pool.endStep();
            int evicted = refusal == 1 ? 2 : 0;
            int sealedPage = pool.view().pageOf(cached[evicted]);
            assertEquals(a, pool.view().sealedFor(sealedPage));
            long[] resident = IntStream.range(0, 3).filter(i -> i != evicted).mapToLong(i -> cached[i]).toArray();
            long digest = pool.stateDigest();
            int size = cache.size();
            RuntimeException e = assertThrows(RuntimeException.class,
                    () -> matcher.match(cache, pool, a, request, dev.kvshield.handle.PageHandles.sealedReference(handles[evicted]), resident));
            Class<?> expected = switch (refusal) {
                case 0 -> IllegalArgumentException.class;
                case 1 -> DuplicateLeaseException.class;
                default -> LeaseCapacityException.class;
            };
            assertTrue(expected.isInstance(e), e.toString());
            assertEquals(size, cache.size());
            return digest == pool.stateDigest() && pool.view().sealedFor(sealedPage) == a;
        }
    }

    @Test
    void plantedBugReclaimingBeforeTheShareIsCheckedLeavesTheRefusedMatchHalfApplied() {
        for (int refusal = 0; refusal < 3; refusal++) {
            assertFalse(refusedMatchAfterASealedBlock(RECLAIM_THEN_SHARE, refusal), "twin: refusal " + refusal);
        }
    }

    @Test
    void aMatchWithARequestIdThatIsNotOneReclaimsNothing() {
        assertTrue(refusedMatchAfterASealedBlock(THROUGH_THE_CACHE, 0));
    }

    @Test
    void aSecondMatchByARequestThatAlreadyReadsReclaimsNothing() {
        assertTrue(refusedMatchAfterASealedBlock(THROUGH_THE_CACHE, 1));
    }

    @Test
    void aMatchTheLeaseTableCannotHoldReclaimsNothing() {
        assertTrue(refusedMatchAfterASealedBlock(THROUGH_THE_CACHE, 2));
    }
}
