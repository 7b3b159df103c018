package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.prefix.PrefixCache;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.EpochSealer;
import dev.kvshield.testing.FaultyPageMemory;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PageRecords;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.UnaryOperator;
import java.util.stream.IntStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.opentest4j.AssertionFailedError;

/**
 * Every public batch call with a failure at every position of its batch. Two kinds of failure:
 *
 * <ul>
 *   <li><b>Bad input</b>: a duplicate, a released, never-minted, malformed, forged (another page's
 *       bits), foreign (other tenant, other holder, other pool) or wrong-kind id at every index of
 *       every input array, at an offset inside a larger array. The call must throw and the pool must
 *       be exactly as before (state digest, and every page's owners and bytes); the same call with
 *       the good input must then succeed (nothing was consumed).
 *   <li><b>Failing work</b>: a backend (scrub, verify) or a sealer (seal, unseal) that fails after
 *       {@code k} pages, for every {@code k}. Every page the failed work touched must be out of reach
 *       (quarantined as failed, then retired and zero after the next boundary), every other page
 *       exactly as before, and no page in circulation may hold a tenant's bytes.
 * </ul>
 *
 * Twins: a lease-by-lease release, a backend and a sealer that lose their errors; the same oracles
 * must fire.
 */
class FailureInjectionTest {
    static final PoolGeometry G = TestPools.tinyGeometry(12);
    static final long R1 = Owners.request(1);
    static final long R2 = Owners.request(2);
    static final long R3 = Owners.request(3);
    static final long NS = Owners.namespace(0);
    static final int[] PROMPT = IntStream.range(300, 312).toArray(); // three full pages
    /** Patterns the worlds write: (tenant, request). */
    static final long[][] WRITTEN = {{0, 1}, {1, 2}, {0, 0}};

    // ================================================================= bad input at every index

    /**
     * A ZERO pool where tenant a's request 1 owns three written pages, holds a reader claim on each,
     * and request 3 reads them; a's request 4 owns a page with a claim; tenant b's request 2 owns a
     * page with a claim. Ids of every bad kind are at hand.
     */
    static final class World implements AutoCloseable {
        final TestPools t;
        final TestPools other;
        final Arena arena = Arena.ofConfined();
        final KvPagePool pool;
        final int a;
        final int b;
        final long[] own;
        final long[] claims;
        final long[] readers;
        final long foreign;
        final long foreignClaim;
        final long released;
        final long releasedClaim;
        final long otherPool;
        final long otherOwn;
        final long otherClaim;

        World() {
            t = TestPools.create(G, ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity());
            pool = t.pool;
            a = pool.tenants().register("a");
            b = pool.tenants().register("b");
            long[] gone = Leases.allocateWritten(pool, arena, a, R1, 1, 1);
            releasedClaim = Leases.claim(pool, a, R1, gone[0], ClaimKind.READER, 9);
            pool.dropClaims(a, R1, new long[] {releasedClaim}, 0, 1);
            pool.release(a, R1, gone, 0, 1, ReleaseReason.FINISHED);
            released = gone[0];
            pool.endStep();
            own = Leases.allocateWritten(pool, arena, a, R1, 3, 1);
            claims = new long[3];
            pool.claim(a, R1, own, 0, 3, ClaimKind.READER, 9, claims, 0);
            readers = new long[3];
            pool.share(a, R1, own, 0, 3, LeaseKind.READER, a, R3, readers, 0);
            foreign = Leases.allocateWritten(pool, arena, b, R2, 1, 2)[0];
            foreignClaim = Leases.claim(pool, b, R2, foreign, ClaimKind.WRITER, 9);
            otherOwn = Leases.allocateWritten(pool, arena, a, Owners.request(4), 1, 4)[0];
            otherClaim = Leases.claim(pool, a, Owners.request(4), otherOwn, ClaimKind.READER, 9);
            // Another pool of the same geometry mints, after different calls, an id this pool never minted on that page.
            other = TestPools.create(G, ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity());
            int oa = other.pool.tenants().register("a");
            long[] theirs = new long[4];
            assertTrue(other.pool.allocate(oa, R1, LeaseKind.OWNER, 4, theirs, 0));
            otherPool = theirs[3];
            assertFalse(pool.view().isLive(otherPool), "the other pool's id names no hold here");
        }

        /** Bad ids for slot {@code i} of {@code input}: every duplicate, then every bad kind that is not a duplicate. */
        Map<String, Long> badIds(long[] input, int i, long wrongKind, long otherHolder, long otherTenant, long releasedId) {
            Map<String, Long> bad = new LinkedHashMap<>();
            for (int j = 0; j < input.length; j++) {
                if (j != i) {
                    bad.put("duplicate of index " + j, input[j]);
                }
            }
            LeaseIds ids = pool.view().leaseIds();
            int page = ids.page(input[i]);
            bad.put("released", releasedId);
            bad.put("never minted", ids.encode(ids.serial(input[i]) + 1_000_000, page));
            bad.put("malformed -1", -1L);
            bad.put("malformed 0", 0L);
            bad.put("malformed min", Long.MIN_VALUE);
            bad.put("page bits out of the pool", input[i] | ((1L << ids.pageBits()) - 1));
            bad.put("forged page bits", (input[i] & ~((1L << ids.pageBits()) - 1)) | (page == 1 ? 2 : 1));
            bad.put("another pool's", otherPool);
            bad.put("another tenant's", otherTenant);
            bad.put("another holder's", otherHolder);
            bad.put("wrong kind", wrongKind);
            return bad;
        }

        @Override
        public void close() {
            arena.close();
            other.close();
            t.close();
        }
    }

    /** A batch call under test: applies {@code input[offset, offset + 3)}. */
    interface BatchCall {
        void apply(World w, long[] input, int offset);
    }

    static final int PAD = 2;

    /** {@code input} at offset {@link #PAD} in an array with garbage around it (offsets at array ends included). */
    static long[] padded(long[] input, int tail) {
        long[] a = new long[PAD + input.length + tail];
        Arrays.fill(a, Long.MIN_VALUE + 7);
        System.arraycopy(input, 0, a, PAD, input.length);
        return a;
    }

    /**
     * For every index and every bad id, the call throws a kvshield or argument exception and the
     * pool is exactly as it was; then the good batch succeeds at the end of its array.
     */
    static void everyBadIdAtEveryIndexChangesNothing(String name, BatchCall call, java.util.function.Function<World, long[]> good,
            java.util.function.Function<World, long[]> badKinds) {
        try (World w = new World()) {
            long[] input = good.apply(w);
            long[] kinds = badKinds.apply(w);
            long digest = w.pool.stateDigest();
            PageRecords before = PageRecords.capture(w.pool, w.t.memory);
            int cases = 0;
            for (int i = 0; i < input.length; i++) {
                for (Map.Entry<String, Long> bad : w.badIds(input, i, kinds[0], kinds[1], kinds[2], kinds[3]).entrySet()) {
                    long[] corrupted = input.clone();
                    corrupted[i] = bad.getValue();
                    String where = name + ": " + bad.getKey() + " at index " + i;
                    RuntimeException e = assertThrows(RuntimeException.class, () -> call.apply(w, padded(corrupted, 1), PAD), where);
                    assertTrue(e instanceof KvShieldException || e instanceof IllegalArgumentException, where + ": " + e);
                    assertFalse(e.getMessage() == null || e.getMessage().isBlank(), where);
                    assertEquals(digest, w.pool.stateDigest(), where + " changed the pool (" + e.getMessage() + ")");
                    cases++;
                }
            }
            PageRecords.capture(w.pool, w.t.memory).assertSameAs(before, Set.of(), name);
            assertTrue(cases >= 3 * 12, name + ": " + cases + " cases");
            call.apply(w, padded(input, 0), PAD);
            assertTrue(w.pool.stateDigest() != digest, name + ": the good batch, at the end of its array, applies");
        }
    }

    /** Bad kinds for calls presenting request 1's content leases: its claim, request 4's page, b's page, a released lease. */
    static long[] ownKinds(World w) {
        return new long[] {w.claims[0], w.otherOwn, w.foreign, w.released};
    }

    /** Bad kinds for calls presenting request 1's claims: its page, request 4's claim, b's claim, a dropped claim. */
    static long[] claimKinds(World w) {
        return new long[] {w.own[0], w.otherClaim, w.foreignClaim, w.releasedClaim};
    }

    @Test
    void release() {
        everyBadIdAtEveryIndexChangesNothing("release",
                (w, in, off) -> w.pool.release(w.a, R1, in, off, 3, ReleaseReason.FINISHED), w -> w.own, FailureInjectionTest::ownKinds);
    }

    @Test
    void checkHeld() {
        everyBadIdAtEveryIndexChangesNothing("checkHeld", (w, in, off) -> {
            w.pool.checkHeld(w.a, R1, in, off, 3);
            w.pool.release(w.a, R1, in, off, 3, ReleaseReason.FINISHED); // checkHeld alone changes nothing to see
        }, w -> w.own, FailureInjectionTest::ownKinds);
    }

    @Test
    void share() {
        everyBadIdAtEveryIndexChangesNothing("share",
                (w, in, off) -> w.pool.share(w.a, R1, in, off, 3, LeaseKind.READER, w.a, Owners.request(4), new long[4], 1),
                w -> w.own, FailureInjectionTest::ownKinds);
    }

    @Test
    void transfer() {
        everyBadIdAtEveryIndexChangesNothing("transfer",
                (w, in, off) -> w.pool.transfer(w.a, R1, in, off, 3, LeaseKind.NAMESPACE, NS, new long[3], 0), w -> w.own,
                FailureInjectionTest::ownKinds);
    }

    @Test
    void claim() {
        everyBadIdAtEveryIndexChangesNothing("claim",
                (w, in, off) -> w.pool.claim(w.a, R1, in, off, 3, ClaimKind.WRITER, 4, new long[3], 0), w -> w.own,
                FailureInjectionTest::ownKinds);
    }

    @Test
    void dropClaims() {
        everyBadIdAtEveryIndexChangesNothing("dropClaims", (w, in, off) -> w.pool.dropClaims(w.a, R1, in, off, 3), w -> w.claims,
                FailureInjectionTest::claimKinds);
    }

    @Test
    void fenceClaims() {
        everyBadIdAtEveryIndexChangesNothing("fenceClaims", (w, in, off) -> w.pool.fenceClaims(w.a, R1, in, off, 3), w -> w.claims,
                FailureInjectionTest::claimKinds);
    }

    @Test
    void prefixCacheUnmatch() {
        everyBadIdAtEveryIndexChangesNothing("unmatch",
                (w, in, off) -> new PrefixCache(w.pool).unmatch(w.a, 3, Arrays.copyOfRange(in, off, off + 3), 3),
                w -> w.readers, w -> new long[] {w.otherClaim, w.own[0], w.foreign, w.released});
    }

    @Test
    void prefixCacheInsert() {
        everyBadIdAtEveryIndexChangesNothing("insert",
                (w, in, off) -> new PrefixCache(w.pool).insert(w.a, 1, PROMPT, Arrays.copyOfRange(in, off, off + 3)), w -> w.own,
                FailureInjectionTest::ownKinds);
    }

    /** Planted bug: a release applied lease by lease; a bad id at index {@code i > 0} leaves the ones before it released. */
    @Test
    void plantedBugLeaseByLeaseReleaseTripsTheDigestOracle() {
        AssertionFailedError e = assertThrows(AssertionFailedError.class, () -> everyBadIdAtEveryIndexChangesNothing("twin",
                (w, in, off) -> {
                    for (int i = 0; i < 3; i++) {
                        w.pool.release(w.a, R1, in, off + i, 1, ReleaseReason.FINISHED);
                    }
                }, w -> w.own, FailureInjectionTest::ownKinds));
        assertTrue(e.getMessage().contains("changed the pool"), e.getMessage());
    }

    // ================================================================= reclaim: a bad reference at every index

    @Test
    void reclaimAnswersGoneExactlyWhereTheReferenceIsBadAndReclaimsTheRestWithTheirBytes() {
        for (int i = 0; i < 3; i++) {
            for (int kind = 0; kind < 5; kind++) {
                try (Sealed s = new Sealed(3, UnaryOperator.identity(), false); Arena arena = Arena.ofConfined()) {
                    long[] refs = s.refs.clone();
                    refs[i] = switch (kind) {
                        case 0 -> refs[(i + 1) % 3]; // a duplicate: the second listing is gone
                        case 1 -> s.handles[i]; // the pre-release handle: an older generation
                        case 2 -> PageHandles.sealedReference(s.otherTenantHandle);
                        case 3 -> -5L;
                        default -> PageHandles.encode(999, 1);
                    };
                    long[] out = new long[5];
                    Arrays.fill(out, 77);
                    int got = s.pool().reclaim(s.a, R2, LeaseKind.OWNER, refs, 0, 3, out, 1);
                    String where = "bad ref kind " + kind + " at " + i;
                    assertEquals(2, got, where);
                    assertEquals(77, out[0], where + ": outside the range untouched");
                    assertEquals(77, out[4], where + ": outside the range untouched");
                    for (int j = 0; j < 3; j++) {
                        boolean gone = j == i && kind != 0 || kind == 0 && j == Math.max(i, (i + 1) % 3);
                        if (gone) {
                            assertEquals(LeaseIds.NONE, out[1 + j], where + ": index " + j);
                        } else {
                            int page = s.pool().view().pageOf(out[1 + j]);
                            assertEquals(PageHandles.page(refs[j]), page, where);
                            assertTrue(PoolProbe.holdsPattern(s.t.memory, arena, page, s.a, 1), where + ": exact bytes back");
                        }
                    }
                    if (kind == 2) {
                        assertEquals(s.b, s.pool().view().sealedFor(PageHandles.page(refs[i])), "b's sealed page stays b's");
                    }
                }
            }
        }
    }

    // ================================================================= failing work at every position

    /**
     * An ENCRYPT pool (EpochSealer) where tenant a released {@code n} written pages, sealed (half of
     * them under a second key epoch when {@code twoEpochs}), and tenant b sealed one page; no free
     * page remains, so any hand-out takes sealed pages.
     */
    static final class Sealed implements AutoCloseable {
        final TestPools t;
        final AtomicReference<EpochSealer> sealer = new AtomicReference<>();
        final AtomicReference<FaultyPageMemory> memory = new AtomicReference<>();
        final int a;
        final int b;
        final int z;
        final int regulated;
        final long[] handles;
        final long[] refs;
        final long otherTenantHandle;
        final long[] filler;

        Sealed(int n, UnaryOperator<PoolConfig.Builder> config, boolean swallowing) {
            t = TestPools.create(G, ProtectionLevel.ENCRYPT, c -> config.apply(c.sealer(ctx -> {
                sealer.set(swallowing ? EpochSealer.swallowing(ctx.memory()) : new EpochSealer(ctx.memory()));
                return sealer.get();
            })), m -> {
                memory.set(swallowing ? FaultyPageMemory.swallowing(m) : FaultyPageMemory.failing(m));
                return memory.get();
            });
            KvPagePool pool = t.pool;
            a = pool.tenants().register("a");
            b = pool.tenants().register("b");
            z = pool.tenants().register("z", TenantPolicy.withLevel(ProtectionLevel.ZERO));
            regulated = pool.tenants().register("bank", TenantPolicy.regulatedTenant());
            try (Arena arena = Arena.ofConfined()) {
                long[] mine = Leases.allocateWritten(pool, arena, a, R1, n, 1);
                long[] theirs = Leases.allocateWritten(pool, arena, b, R2, 1, 2);
                handles = Leases.handles(pool, mine);
                otherTenantHandle = pool.view().handleOf(theirs[0]);
                pool.release(a, R1, mine, 0, n / 2, ReleaseReason.FINISHED);
                pool.endStep();
                sealer.get().rotate(a);
                pool.release(a, R1, mine, n / 2, n - n / 2, ReleaseReason.FINISHED);
                pool.release(b, R2, theirs, 0, 1, ReleaseReason.FINISHED);
                pool.endStep();
                filler = new long[pool.snapshot().free()];
                assertTrue(pool.allocate(z, R3, LeaseKind.OWNER, filler.length, filler, 0));
            }
            refs = Arrays.stream(handles).map(PageHandles::sealedReference).toArray();
            assertEquals(n + 1, pool.snapshot().sealed());
        }

        KvPagePool pool() {
            return t.pool;
        }

        /** The sealed pages in hand-out order (oldest first). */
        int[] sealedOldestFirst() {
            List<Integer> pages = new ArrayList<>();
            for (int i = 0; i < handles.length / 2; i++) {
                pages.add(PageHandles.page(handles[i]));
            }
            for (int i = handles.length / 2; i < handles.length; i++) {
                pages.add(PageHandles.page(handles[i]));
            }
            pages.add(PageHandles.page(otherTenantHandle));
            return pages.stream().mapToInt(Integer::intValue).toArray();
        }

        @Override
        public void close() {
            t.close();
        }
    }

    /**
     * The failing-work oracle: right after the failure the touched pages are out of reach and every
     * other page is as it was; after the next boundary the touched pages are retired and zero; and
     * at both moments no page in circulation holds a tenant's bytes.
     */
    static void assertFailedWorkOutOfReach(KvPagePool pool, PageMemory memory, PageRecords before, Set<Integer> touched, String where) {
        PageRecords now = PageRecords.capture(pool, memory);
        now.assertQuarantinedAsFailed(touched, where);
        now.assertSameAs(before, touched, where);
        now.assertNothingLeftInCirculation(WRITTEN, where);
        pool.endStep();
        PageRecords next = PageRecords.capture(pool, memory);
        next.assertRetiredAndZero(touched, where + ", after the boundary");
        next.assertSameAs(before, touched, where + ", after the boundary");
        next.assertNothingLeftInCirculation(WRITTEN, where + ", after the boundary");
        assertEquals(0, pool.snapshot().failed(), where);
    }

    static Set<Integer> firstPages(int[] pages, int n) {
        Set<Integer> s = new HashSet<>();
        for (int i = 0; i < n; i++) {
            s.add(pages[i]);
        }
        return s;
    }

    /** A hand-out of sealed pages under a scrub (or verify) that fails after k pages: nothing is handed out. */
    interface HandOut {
        void handOut(Sealed s, int n);
    }

    static void handOutFailingAfterEveryK(String name, HandOut handOut, FaultyPageMemory.Op op) {
        int n = 3;
        for (int k = 0; k < n; k++) {
            try (Sealed s = new Sealed(4, UnaryOperator.identity(), false)) {
                KvPagePool pool = s.pool();
                PageRecords before = PageRecords.capture(pool, s.t.memory);
                Set<Integer> touched = firstPages(s.sealedOldestFirst(), n);
                s.memory.get().arm(op, k, 1);
                String where = name + " failing after " + k + " of " + n;
                ProtectionException e = assertThrows(ProtectionException.class, () -> handOut.handOut(s, n), where);
                assertTrue(e.getMessage().contains("scrubbed and retired, nothing was handed out"), e.getMessage());
                assertEquals(0, pool.ownedBy(s.b) + pool.ownedBy(s.regulated), where + ": the recipients got nothing");
                assertFailedWorkOutOfReach(pool, s.t.memory, before, touched, where);
            }
        }
    }

    @Test
    void allocateOverSealedPagesWithAScrubFailingAfterEveryK() {
        handOutFailingAfterEveryK("allocate", (s, n) -> s.pool().allocate(s.b, R2, LeaseKind.OWNER, n, new long[n], 0),
                FaultyPageMemory.Op.SCRUB);
    }

    @Test
    void allocateToARegulatedTenantWithAVerifyFailingAfterEveryK() {
        handOutFailingAfterEveryK("allocate (COMPLIANCE)",
                (s, n) -> s.pool().allocate(s.regulated, R2, LeaseKind.OWNER, n, new long[n], 0), FaultyPageMemory.Op.VERIFY);
    }

    @Test
    void allocateRowsOverSealedPagesWithAScrubFailingAfterEveryK() {
        handOutFailingAfterEveryK("allocateRows", (s, n) -> s.pool().allocateRows(2, new int[] {s.b, s.regulated},
                new long[] {R2, R3}, new int[] {n - 1, 1}, LeaseKind.OWNER, new long[n], 0), FaultyPageMemory.Op.SCRUB);
    }

    @Test
    void handoffReserveOverSealedPagesWithAScrubFailingAfterEveryK() {
        handOutFailingAfterEveryK("reserve", (s, n) -> {
            HandoffReceiver receiver = new HandoffReceiver(s.pool(), line -> { });
            receiver.handshake(1, receiver.effectiveLimitTokens());
            try {
                receiver.reserve(s.b, 2, (long) n * G.pageSizeTokens(), 1);
            } finally {
                assertEquals(0, receiver.unacknowledged());
            }
        }, FaultyPageMemory.Op.SCRUB);
    }

    /** Reclaims of four pages sealed under two epochs with an unseal failing after every k: all four are retired. */
    static void reclaimFailingAfterEveryK(boolean swallowing) {
        int n = 4;
        for (int k = 0; k < n; k++) {
            try (Sealed s = new Sealed(n, UnaryOperator.identity(), swallowing)) {
                KvPagePool pool = s.pool();
                PageRecords before = PageRecords.capture(pool, s.t.memory);
                Set<Integer> touched = firstPages(s.sealedOldestFirst(), n);
                s.sealer.get().failUnsealAfter(k);
                String where = "reclaim failing after " + k + " of " + n;
                boolean threw = false;
                try {
                    pool.reclaim(s.a, R2, LeaseKind.OWNER, s.refs, 0, n, new long[n], 0);
                } catch (ProtectionException e) {
                    threw = true;
                }
                assertFailedWorkOutOfReach(pool, s.t.memory, before, touched, where);
                assertTrue(threw, where);
                assertEquals(0, pool.ownedBy(s.a), where);
            }
        }
    }

    @Test
    void reclaimAcrossTwoEpochsWithAnUnsealFailingAfterEveryK() {
        reclaimFailingAfterEveryK(false);
    }

    @Test
    void plantedBugASealerThatLosesTheUnsealErrorHandsOutPagesStillSealed() {
        AssertionFailedError e = assertThrows(AssertionFailedError.class, () -> reclaimFailingAfterEveryK(true),
                "twin: the reclaim returns normally and the half-unsealed pages are handed out instead of retired");
        assertTrue(e.getMessage().contains("is not out of reach"), e.getMessage());
    }

    /**
     * Tenant a releases three written pages (and tenant b's page stays owned) while protection fails
     * after k pages: the release itself succeeds; the whole batch is failed, scrubbed and retired at
     * the boundary.
     */
    static void releaseWithProtectionFailingAfterEveryK(ProtectionLevel level, QuarantineMode mode, FaultyPageMemory.Op op,
            boolean seal, boolean swallowing, boolean throughClaims) {
        int n = 3;
        for (int k = 0; k < n; k++) {
            AtomicReference<FaultyPageMemory> memory = new AtomicReference<>();
            AtomicReference<EpochSealer> sealer = new AtomicReference<>();
            try (TestPools t = TestPools.create(G, level, c -> c.quarantineMode(mode).sealer(ctx -> {
                sealer.set(new EpochSealer(ctx.memory()));
                return sealer.get();
            }), m -> {
                memory.set(swallowing ? FaultyPageMemory.swallowing(m) : FaultyPageMemory.failing(m));
                return memory.get();
            }); Arena arena = Arena.ofConfined()) {
                KvPagePool pool = t.pool;
                int a = pool.tenants().register("a");
                int b = pool.tenants().register("b");
                long[] mine = Leases.allocateWritten(pool, arena, a, R1, n, 1);
                Leases.allocateWritten(pool, arena, b, R2, 1, 2);
                long[] claims = new long[n];
                if (throughClaims) {
                    pool.claim(a, R1, mine, 0, n, ClaimKind.WRITER, 4, claims, 0);
                }
                PageRecords before = PageRecords.capture(pool, t.memory);
                Set<Integer> touched = new HashSet<>();
                Arrays.stream(mine).forEach(l -> touched.add(pool.view().pageOf(l)));
                if (seal) {
                    sealer.get().failSealAfter(k);
                } else {
                    memory.get().arm(op, k, 1);
                }
                pool.release(a, R1, mine, 0, n, ReleaseReason.FINISHED);
                if (throughClaims) {
                    pool.dropClaims(a, R1, claims, 0, n);
                }
                String where = level + " " + mode + (throughClaims ? " dropClaims" : " release") + " failing after " + k + " of " + n;
                // The failure shows at the boundary: the batch is failed, then scrubbed and retired in the same collection.
                pool.endStep();
                PageRecords after = PageRecords.capture(pool, t.memory);
                after.assertRetiredAndZero(touched, where);
                after.assertSameAs(before, touched, where);
                after.assertNothingLeftInCirculation(WRITTEN, where);
                assertTrue(pool.metrics().protectionFailureCount() >= n, where);
            }
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void releaseWithAScrubFailingAfterEveryK(QuarantineMode mode) {
        releaseWithProtectionFailingAfterEveryK(ProtectionLevel.ZERO, mode, FaultyPageMemory.Op.SCRUB, false, false, false);
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void releaseUnderComplianceWithAVerifyFailingAfterEveryK(QuarantineMode mode) {
        releaseWithProtectionFailingAfterEveryK(ProtectionLevel.COMPLIANCE, mode, FaultyPageMemory.Op.VERIFY, false, false, false);
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void releaseUnderEncryptWithASealFailingAfterEveryK(QuarantineMode mode) {
        releaseWithProtectionFailingAfterEveryK(ProtectionLevel.ENCRYPT, mode, null, true, false, false);
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void dropClaimsWithAScrubFailingAfterEveryK(QuarantineMode mode) {
        releaseWithProtectionFailingAfterEveryK(ProtectionLevel.ZERO, mode, FaultyPageMemory.Op.SCRUB, false, false, true);
    }

    @Test
    void plantedBugABackendThatLosesTheScrubErrorPutsPlaintextInTheFreeList() {
        AssertionFailedError e = assertThrows(AssertionFailedError.class, () -> releaseWithProtectionFailingAfterEveryK(ProtectionLevel.ZERO,
                QuarantineMode.SYNCHRONOUS, FaultyPageMemory.Op.SCRUB, false, true, false));
        assertTrue(e.getMessage().contains("RETIRED") || e.getMessage().contains("FREE page"), e.getMessage());
    }

    // ================================================================= the prefix cache and the handoff on failing work

    /** An ENCRYPT pool (EpochSealer) with tenant a's prompt, written by request 1, in a prefix cache. */
    static final class CachedPrompt implements AutoCloseable {
        final AtomicReference<EpochSealer> sealer = new AtomicReference<>();
        final TestPools t = TestPools.create(G, ProtectionLevel.ENCRYPT, c -> c.sealer(ctx -> {
            sealer.set(new EpochSealer(ctx.memory()));
            return sealer.get();
        }), UnaryOperator.identity());
        final KvPagePool pool = t.pool;
        final int a = pool.tenants().register("a");
        final PrefixCache cache = new PrefixCache(pool);
        final Set<Integer> pages = new HashSet<>();

        CachedPrompt() {
            try (Arena arena = Arena.ofConfined()) {
                long[] h = Leases.allocateWritten(pool, arena, a, R1, 3, 0);
                Arrays.stream(h).forEach(l -> pages.add(pool.view().pageOf(l)));
                assertEquals(3, cache.insert(a, 1, PROMPT, h));
            }
        }

        @Override
        public void close() {
            t.close();
        }
    }

    /**
     * Tenant a's cached prompt is evicted with a seal failing after k; the failed pages are retired,
     * and a later match finds nothing and drops the entries.
     */
    @Test
    void prefixEvictWithASealFailingAfterEveryK() {
        for (int k = 0; k < 3; k++) {
            try (CachedPrompt c = new CachedPrompt()) {
                PageRecords before = PageRecords.capture(c.pool, c.t.memory);
                c.sealer.get().failSealAfter(k);
                assertEquals(3, c.cache.evict(3));
                c.pool.endStep();
                String where = "evict failing after " + k;
                PageRecords after = PageRecords.capture(c.pool, c.t.memory);
                after.assertRetiredAndZero(c.pages, where);
                after.assertSameAs(before, c.pages, where);
                after.assertNothingLeftInCirculation(WRITTEN, where);
                assertEquals(0, c.cache.match(c.a, 2, PROMPT, new long[3]), where + ": the retired prefix is gone");
                assertEquals(0, c.cache.size(), where);
            }
        }
    }

    /**
     * The cached prompt's three pages are evicted and sealed; a match reclaims them with an unseal
     * failing after k: the match throws, the three pages are retired, and the next match is a miss.
     */
    @Test
    void prefixMatchWithAnUnsealFailingAfterEveryK() {
        for (int k = 0; k < 3; k++) {
            try (CachedPrompt c = new CachedPrompt()) {
                assertEquals(3, c.cache.evict(3));
                c.pool.endStep();
                PageRecords before = PageRecords.capture(c.pool, c.t.memory);
                c.sealer.get().failUnsealAfter(k);
                String where = "match failing after " + k;
                assertThrows(ProtectionException.class, () -> c.cache.match(c.a, 2, PROMPT, new long[3]), where);
                assertFailedWorkOutOfReach(c.pool, c.t.memory, before, c.pages, where);
                c.sealer.get().failUnsealAfter(-1);
                assertEquals(0, c.cache.match(c.a, 2, PROMPT, new long[3]), where + ": the retired prefix is gone");
            }
        }
    }

    /**
     * A handoff's pages are aborted while its writer claims live; the acknowledgement drops the
     * claims and their protection fails after k: the pages are retired, nothing else moves.
     */
    @Test
    void handoffAcknowledgeWithAScrubFailingAfterEveryK() {
        for (int k = 0; k < 3; k++) {
            AtomicReference<FaultyPageMemory> memory = new AtomicReference<>();
            try (TestPools t = TestPools.create(G, ProtectionLevel.ZERO, UnaryOperator.identity(), m -> {
                memory.set(FaultyPageMemory.failing(m));
                return memory.get();
            }); Arena arena = Arena.ofConfined()) {
                KvPagePool pool = t.pool;
                int a = pool.tenants().register("a");
                HandoffReceiver receiver = new HandoffReceiver(pool, line -> { });
                receiver.handshake(1, receiver.effectiveLimitTokens());
                Reservation r = receiver.reserve(a, 5, 3L * G.pageSizeTokens(), 1);
                for (int i = 0; i < 3; i++) {
                    for (int buffer = 0; buffer < G.bufferCount(); buffer++) {
                        receiver.write(r, i, buffer, 0, dev.kvshield.testing.Patterns.fill(arena, G.pageBytes(buffer), a, 1, r.page(i), buffer));
                    }
                }
                receiver.abort(r);
                Set<Integer> touched = Set.of(r.page(0), r.page(1), r.page(2));
                PageRecords before = PageRecords.capture(pool, t.memory);
                memory.get().arm(FaultyPageMemory.Op.SCRUB, k, 1);
                receiver.acknowledge(r);
                pool.endStep();
                String where = "acknowledge failing after " + k;
                PageRecords after = PageRecords.capture(pool, t.memory);
                after.assertRetiredAndZero(touched, where);
                after.assertSameAs(before, touched, where);
                after.assertNothingLeftInCirculation(WRITTEN, where);
                assertEquals(0, receiver.unacknowledged());
            }
        }
    }
}
