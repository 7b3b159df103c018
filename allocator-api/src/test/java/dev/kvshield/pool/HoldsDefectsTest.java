package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.LeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseIdsExhaustedException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.tenant.UnknownTenantException;
import dev.kvshield.testing.EpochSealer;
import dev.kvshield.testing.FaultyPageMemory;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PageRecords;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.ValueLayout;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.opentest4j.AssertionFailedError;

/**
 * The defect classes the pool had before holds became leases, each reproduced against the lease
 * pool with an oracle on the bytes that come back and on the pool's owners, and each with a
 * planted-bug twin that supplies the old bug through a test seam and must make the same oracle
 * fire. (Reader counts that underflow and the handoff that cannot finish live with the prefix cache
 * and the handoff tests.)
 */
class HoldsDefectsTest {
    static final long R1 = Owners.request(1);
    static final long R2 = Owners.request(2);

    // ------------------------------------------------------------ ids that wrap

    /** How a client turns the claim it kept into the id it presents. */
    interface ClaimView {
        long present(KvPagePool pool, long kept, long liveClaimOnThePage);
    }

    static final ClaimView AS_KEPT = (pool, kept, live) -> kept;
    /** Planted bug: ids that wrap, so the stale id names the live claim minted on its page since. */
    static final ClaimView WRAPPED = (pool, kept, live) -> pool.view().pageOf(kept) == pool.view().pageOf(live) ? live : kept;

    /**
     * Tenant b's writer claim on page q is dropped and q goes to tenant a, who writes its KV and takes
     * a writer claim of its own; b's transport then writes through the claim id it kept. Returns
     * whether a's bytes survived and a still holds q exactly as before.
     */
    static boolean victimSurvivesAStaleClaim(ClaimView view) {
        PoolGeometry g = TestPools.tinyGeometry(8);
        long max = new LeaseIds(g.pageCount()).maxSerial();
        try (TestPools t = TestPools.create(g, ProtectionLevel.ZERO, c -> c.testingFirstLeaseSerial(max - 7), UnaryOperator.identity());
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] hb = new long[1];
            assertTrue(pool.allocate(b, R2, LeaseKind.OWNER, 1, hb, 0));
            long stale = Leases.claim(pool, b, R2, hb[0], ClaimKind.WRITER, 9);
            pool.dropClaims(b, R2, new long[] {stale}, 0, 1);
            pool.release(b, R2, hb, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            long[] ha = new long[1];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 1, ha, 0));
            int q = pool.view().pageOf(ha[0]);
            assertEquals(pool.view().pageOf(stale), q, "LIFO reuse hands a the page b's stale claim names");
            Leases.fillPage(pool, arena, a, R1, ha[0], 1);
            long live = Leases.claim(pool, a, R1, ha[0], ClaimKind.WRITER, 5);
            PageRecords before = PageRecords.capture(pool, t.memory);
            long presented = view.present(pool, stale, live);
            try {
                // The stale transport writes b's pattern as whoever the id it presents belongs to (a bare-id adapter).
                long holder = pool.view().isLive(presented) ? pool.view().holderOf(presented) : R2;
                int tenant = pool.view().isLive(presented) ? pool.view().tenantOfLease(presented) : b;
                pool.write(tenant, holder, presented, 0, 0, Patterns.fill(arena, g.pageBytes(0), b, 2, q, 0));
            } catch (ReleasedLeaseException e) {
                assertTrue(e.getMessage().contains("never reused"), e.getMessage());
            }
            PageRecords after = PageRecords.capture(pool, t.memory);
            return PoolProbe.holdsPattern(t.memory, arena, q, a, 1) && pool.view().tenantOf(q) == a && pool.view().claims(q) == 1
                    && java.util.Arrays.equals(before.page(q).bytes(), after.page(q).bytes());
        }
    }

    @Test
    void aStaleClaimIdNeverNamesTheLiveClaimMintedOnItsPage() {
        assertTrue(victimSurvivesAStaleClaim(AS_KEPT));
    }

    @Test
    void plantedBugWrappingIdsLetTheStaleClaimWriteIntoTheVictimsPage() {
        assertFalse(victimSurvivesAStaleClaim(WRAPPED), "twin: a wrapped id is the live claim, and b's bytes land in a's page");
    }

    @Test
    void leaseIdsRunOutCleanlyAtTheirWidthAndNeverWrap() {
        PoolGeometry g = TestPools.tinyGeometry(8);
        LeaseIds ids = new LeaseIds(g.pageCount());
        long max = ids.maxSerial();
        try (TestPools t = TestPools.create(g, ProtectionLevel.ZERO, c -> c.testingFirstLeaseSerial(max - 5), UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[7];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 2, h, 0));
            long[] claims = new long[2];
            pool.claim(a, R1, h, 0, 2, ClaimKind.WRITER, 3, claims, 0);
            long digest = pool.stateDigest();
            PageRecords before = PageRecords.capture(pool, t.memory);
            LeaseIdsExhaustedException e = assertThrows(LeaseIdsExhaustedException.class,
                    () -> pool.allocate(a, R2, LeaseKind.OWNER, 3, h, 2), "3 asked, 2 serials left");
            assertTrue(e.getMessage().contains("never wrap"), e.getMessage());
            assertEquals(digest, pool.stateDigest(), "a refused mint changes nothing");
            PageRecords.capture(pool, t.memory).assertSameAs(before, Set.of(), "refused mint");
            assertTrue(pool.allocate(a, R2, LeaseKind.OWNER, 2, h, 2), "the last two serials are minted");
            assertEquals(max, ids.serial(h[3]), "the last id carries the largest serial");
            Set<Long> seen = new HashSet<>();
            for (long id : new long[] {h[0], h[1], claims[0], claims[1], h[2], h[3]}) {
                assertTrue(seen.add(id), "id " + id + " minted twice");
                assertTrue(ids.serial(id) >= max - 5 && ids.serial(id) <= max, "serial in range: " + ids.serial(id));
            }
            long exhausted = pool.stateDigest();
            long[] out = new long[1];
            assertThrows(LeaseIdsExhaustedException.class, () -> pool.allocate(a, R2, LeaseKind.OWNER, 1, out, 0));
            assertThrows(LeaseIdsExhaustedException.class,
                    () -> pool.claim(a, R2, new long[] {h[2]}, 0, 1, ClaimKind.READER, 4, out, 0));
            assertThrows(LeaseIdsExhaustedException.class,
                    () -> pool.share(a, R2, new long[] {h[2]}, 0, 1, LeaseKind.READER, a, Owners.request(3), out, 0));
            assertThrows(LeaseIdsExhaustedException.class,
                    () -> pool.transfer(a, R2, new long[] {h[2]}, 0, 1, LeaseKind.NAMESPACE, Owners.namespace(0), out, 0));
            assertEquals(exhausted, pool.stateDigest(), "every refused mint at the end of the ids changes nothing");
            // Holds still end: the pool drains, and then still mints nothing.
            pool.dropClaims(a, R1, claims, 0, 2);
            pool.release(a, R1, h, 0, 2, ReleaseReason.FINISHED);
            pool.release(a, R2, h, 2, 2, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(g.usablePages(), pool.snapshot().free());
            assertThrows(LeaseIdsExhaustedException.class, () -> pool.allocate(a, R2, LeaseKind.OWNER, 1, out, 0));
            assertThrows(ReleasedLeaseException.class, () -> pool.release(a, R2, h, 2, 1, ReleaseReason.FINISHED),
                    "a dead id stays dead after exhaustion: nothing was reused");
        }
    }

    // ------------------------------------------------------------ a reclaim that stops half way

    /**
     * Tenant a sealed page p1 under key epoch 1 and page p2 under epoch 2, and page p3 under epoch 1
     * that no reclaim touches. A reclaim of p1 and p2 unseals epoch 1, then epoch 2 is retired
     * before its unseal runs. {@code behindThePool} stands for the old reclaim: the first epoch's
     * unseal lands and the pool's records never learn of it.
     */
    static void reclaimAcrossARetiredEpoch(boolean behindThePool, java.util.function.Consumer<PageRecords> oracle) {
        PoolGeometry g = TestPools.tinyGeometry(5);
        AtomicReference<EpochSealer> sealer = new AtomicReference<>();
        try (TestPools t = TestPools.create(g, ProtectionLevel.ENCRYPT, c -> c.sealer(ctx -> {
            sealer.set(new EpochSealer(ctx.memory()));
            return sealer.get();
        }), UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 3, 1);
            long[] handles = Leases.handles(pool, h);
            pool.release(a, R1, new long[] {h[0], h[2]}, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            sealer.get().rotate(a);
            pool.release(a, R1, new long[] {h[1]}, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            int p1 = pool.view().pageOf(h[0]);
            int p2 = pool.view().pageOf(h[1]);
            int p3 = pool.view().pageOf(h[2]);
            long[] refs = {PageHandles.sealedReference(handles[0]), PageHandles.sealedReference(handles[1])};
            PageRecords before = PageRecords.capture(pool, t.memory);
            if (behindThePool) {
                sealer.get().unseal(a, 1, new int[] {p1}, new int[] {pool.view().generationOf(p1)}, 0, 1);
                sealer.get().retire(a, 2);
            } else {
                sealer.get().beforeUnseal((tenant, epoch) -> {
                    if (epoch == 1) {
                        sealer.get().retire(a, 2);
                    }
                    return 0;
                });
                ProtectionException e = assertThrows(ProtectionException.class,
                        () -> pool.reclaim(a, R2, LeaseKind.OWNER, refs, 0, 2, new long[2], 0));
                assertTrue(e.getMessage().contains("after 1 of 2 were unsealed"), e.getMessage());
                PageRecords failed = PageRecords.capture(pool, t.memory);
                failed.assertQuarantinedAsFailed(Set.of(p1, p2), "reclaim failed between epochs");
                failed.assertSameAs(before, Set.of(p1, p2), "reclaim failed between epochs");
            }
            assertEquals(behindThePool ? 3 : 1, pool.shredTenant(a), behindThePool
                    ? "the old reclaim: p1 and p2 are still reported sealed and made unrecoverable" : "only p3 is sealed and unrecoverable");
            assertEquals(-1, pool.view().sealedFor(p3));
            assertEquals(PageState.SEALED, pool.view().stateOf(p3));
            oracle.accept(PageRecords.capture(pool, t.memory));
            pool.endStep();
            if (!behindThePool) {
                PageRecords.capture(pool, t.memory).assertRetiredAndZero(Set.of(p1, p2), "after the boundary");
            }
        }
    }

    static final long[][] WRITTEN_BY_A = {{0, 1}};

    @Test
    void aReclaimThatFailsBetweenEpochsLeavesNoPlaintextInASealedPage() {
        reclaimAcrossARetiredEpoch(false, r -> r.assertNothingLeftInCirculation(WRITTEN_BY_A, "after the failed reclaim"));
    }

    @Test
    void plantedBugAReclaimWhoseFirstUnsealTheRecordsNeverLearnOfLeavesPlaintextInASealedPage() {
        reclaimAcrossARetiredEpoch(true, r -> assertThrows(AssertionFailedError.class,
                () -> r.assertNothingLeftInCirculation(WRITTEN_BY_A, "twin"), "twin: p1 is SEALED and holds a's plaintext"));
    }

    // ------------------------------------------------------------ partially applied batches

    /** How an adapter applies a release batch. */
    interface Releaser {
        void release(KvPagePool pool, int tenant, long holder, long[] leases);
    }

    static final Releaser ONE_CALL = (pool, tenant, holder, leases) -> pool.release(tenant, holder, leases, 0, leases.length,
            ReleaseReason.EVICTED);
    /** Planted bug: one call per lease, so a bad lease at index i leaves the ones before it applied. */
    static final Releaser LEASE_BY_LEASE = (pool, tenant, holder, leases) -> {
        for (int i = 0; i < leases.length; i++) {
            pool.release(tenant, holder, leases, i, 1, ReleaseReason.EVICTED);
        }
    };

    /** Releases {@code [p, q, p]}; returns true if the pool (digest, owners, bytes) is exactly as before. */
    static boolean duplicateEvictLeavesThePoolAsItWas(Releaser releaser, Class<? extends LeaseException> refusal) {
        try (TestPools t = TestPools.create(5, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 2, 1);
            PageRecords before = PageRecords.capture(pool, t.memory);
            assertThrows(refusal, () -> releaser.release(pool, a, R1, new long[] {h[0], h[1], h[0]}));
            pool.endStep();
            pool.endStep();
            // After the boundaries a half-applied release would have handed p and q back, zeroed.
            try {
                PageRecords.capture(pool, t.memory).assertSameAs(before, Set.of(), "duplicate evict");
            } catch (AssertionFailedError e) {
                return false;
            }
            return pool.view().isLive(h[0]) && pool.view().isLive(h[1]);
        }
    }

    @Test
    void anEvictOfPQPMovesNothing() {
        assertTrue(duplicateEvictLeavesThePoolAsItWas(ONE_CALL, DuplicateLeaseException.class));
    }

    @Test
    void plantedBugLeaseByLeaseEvictMovesPAndQBeforeTheDuplicateThrows() {
        assertFalse(duplicateEvictLeavesThePoolAsItWas(LEASE_BY_LEASE, ReleasedLeaseException.class));
    }

    /** How an adapter hands out a step's rows. */
    interface RowAllocator {
        boolean allocate(KvPagePool pool, int[] tenants, long[] holders, int[] counts, long[] out);
    }

    static final RowAllocator ALL_ROWS = (pool, tenants, holders, counts, out) -> pool.allocateRows(tenants.length, tenants, holders,
            counts, LeaseKind.OWNER, out, 0);
    /** Planted bug: one allocation per row, so a row that fails keeps the rows before it. */
    static final RowAllocator ROW_BY_ROW = (pool, tenants, holders, counts, out) -> {
        int at = 0;
        for (int r = 0; r < tenants.length; r++) {
            if (!pool.allocate(tenants[r], holders[r], LeaseKind.OWNER, counts[r], out, at)) {
                return false;
            }
            at += counts[r];
        }
        return true;
    };

    /**
     * Four rows, one bad at {@code badRow} (an unknown tenant, a namespace holder for OWNER pages, a
     * negative count, or a tenant past its quota); returns the rows whose pages stayed handed out.
     */
    static int rowsKeptAfterABadRow(RowAllocator allocator, int badRow, int badness) {
        try (TestPools t = TestPools.create(12, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int small = pool.tenants().register("small", TenantPolicy.withQuota(1));
            int[] tenants = {a, a, a, a};
            long[] holders = {R1, R2, Owners.request(3), Owners.request(4)};
            int[] counts = {2, 1, 2, 1};
            switch (badness) {
                case 0 -> tenants[badRow] = 9;
                case 1 -> holders[badRow] = Owners.namespace(1);
                case 2 -> counts[badRow] = -1;
                default -> {
                    tenants[badRow] = small;
                    counts[badRow] = 2;
                }
            }
            long digest = pool.stateDigest();
            try {
                assertFalse(allocator.allocate(pool, tenants, holders, counts, new long[8]), "a row past its quota answers none");
                assertEquals(3, badness, "only the quota row answers none; the others throw");
            } catch (UnknownTenantException | IllegalArgumentException e) {
                assertTrue(badness < 3, e.toString());
            }
            if (pool.stateDigest() == digest) {
                assertEquals(0, pool.snapshot().owned());
                return 0;
            }
            int kept = 0;
            for (int r = 0; r < 4; r++) {
                long[] found = new long[pool.geometry().pageCount()];
                int[] all = java.util.stream.IntStream.range(0, pool.geometry().pageCount()).toArray();
                kept += pool.view().leasesOf(all, 0, all.length, a, holders[r], LeaseKind.OWNER, found, 0) > 0 ? 1 : 0;
            }
            return kept;
        }
    }

    @Test
    void aMultiRowAllocationWithABadRowKeepsNoRowWhereverTheBadRowIs() {
        for (int bad = 0; bad < 4; bad++) {
            for (int badness = 0; badness < 4; badness++) {
                assertEquals(0, rowsKeptAfterABadRow(ALL_ROWS, bad, badness), "bad row " + bad + " kind " + badness);
            }
        }
    }

    @Test
    void plantedBugRowByRowAllocationKeepsTheRowsBeforeTheBadOne() {
        for (int bad = 0; bad < 4; bad++) {
            for (int badness = 0; badness < 4; badness++) {
                assertEquals(bad, rowsKeptAfterABadRow(ROW_BY_ROW, bad, badness), "twin: bad row " + bad + " kind " + badness);
            }
        }
    }

    // ------------------------------------------------------------ lost retries

    /**
     * Two pages of tenant a are released while the backend fails: the protection fails, and so do
     * the scrubs of the next two boundaries; then the backend works. The oracle, at every boundary:
     * every page is in one of the pool's states, every quarantined page is queued for a retry
     * (counted as failed, never promised as available), every retired page is zero, and no page in
     * circulation holds a's bytes.
     *
     * @return the boundary at which both pages were retired
     */
    static int retriesThatFailAgain(UnaryOperator<PageMemory> backend) {
        AtomicReference<FaultyPageMemory> faulty = new AtomicReference<>();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(5), ProtectionLevel.ZERO, UnaryOperator.identity(), m -> {
            faulty.set((FaultyPageMemory) backend.apply(m));
            return faulty.get();
        }); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 2, 1);
            Set<Integer> pages = Set.of(pool.view().pageOf(h[0]), pool.view().pageOf(h[1]));
            faulty.get().arm(FaultyPageMemory.Op.SCRUB, 1, 3);
            pool.release(a, R1, h, 0, 2, ReleaseReason.FINISHED);
            for (int boundary = 0; boundary < 5; boundary++) {
                pool.endStep();
                String where = "boundary " + boundary;
                PoolSnapshot s = pool.snapshot();
                assertEquals(4, s.total(), where + ": no page leaves the pool's states");
                assertEquals(s.quarantined(), s.failed(), where + ": every quarantined page is queued for a retry: " + s);
                assertEquals(s.free(), pool.available(), where + ": failed pages are never promised");
                PageRecords now = PageRecords.capture(pool, t.memory);
                now.assertNothingLeftInCirculation(WRITTEN_BY_A, where);
                if (s.quarantined() > 0) {
                    now.assertQuarantinedAsFailed(pages, where);
                } else {
                    now.assertRetiredAndZero(pages, where);
                    return boundary;
                }
            }
            throw new AssertionFailedError("the failed pages were never retired");
        }
    }

    @Test
    void aProtectionRetryThatFailsAgainKeepsThePagesQueuedUntilAScrubWorks() {
        assertEquals(2, retriesThatFailAgain(FaultyPageMemory::failing), "two failed retries, then the third boundary's scrub works");
    }

    @Test
    void plantedBugABackendThatLosesTheRetrysErrorRetiresPagesHoldingPlaintext() {
        AssertionFailedError e = assertThrows(AssertionFailedError.class, () -> retriesThatFailAgain(FaultyPageMemory::losingRetries),
                "twin: the pool counts the lost retry as done, and the retired pages still hold a's bytes");
        assertTrue(e.getMessage().contains("boundary 0: retired page"), e.getMessage());
    }

    // ------------------------------------------------------------ COMPLIANCE hand-outs of sealed pages

    /**
     * A backend whose scrub misses the first byte of one page (a stuck line of memory); the twin's
     * verify also reports every page clean.
     */
    static PageMemory stickyPage(PageMemory m, int stuckPage, boolean lyingVerify, AtomicBoolean stuck) {
        return new ForwardingPageMemory(m) {
            @Override
            public void scrub(int[] pages, int offset, int count) {
                super.scrub(pages, offset, count);
                for (int i = offset; i < offset + count; i++) {
                    if (stuck.get() && pages[i] == stuckPage) {
                        hostRegion(stuckPage, 0).set(ValueLayout.JAVA_BYTE, 0, (byte) 0x5A);
                    }
                }
            }

            @Override
            public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
                return lyingVerify ? 0 : super.verifyZero(pages, offset, count, dirtyOut);
            }
        };
    }

    /**
     * Tenant a (ENCRYPT) seals three pages; a ZERO tenant and a regulated (COMPLIANCE) tenant then take
     * two of them in one step, the oldest first, whose scrub sticks. Returns the raw bytes each
     * hand-out got.
     */
    static byte[][] sealedPagesHandedToACompliantRow(boolean lyingVerify) {
        PoolGeometry g = TestPools.tinyGeometry(4);
        AtomicBoolean stuck = new AtomicBoolean();
        try (TestPools t = TestPools.create(g, ProtectionLevel.ENCRYPT, c -> c.sealer(ctx -> new EpochSealer(ctx.memory())),
                m -> stickyPage(m, 2, lyingVerify, stuck)); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int z = pool.tenants().register("z", TenantPolicy.withLevel(ProtectionLevel.ZERO));
            int regulated = pool.tenants().register("bank", TenantPolicy.regulatedTenant());
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 3, 1);
            pool.release(a, R1, new long[] {h[1]}, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            pool.release(a, R1, new long[] {h[0], h[2]}, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(3, pool.snapshot().sealed());
            stuck.set(true);
            long[] out = new long[2];
            assertTrue(pool.allocateRows(2, new int[] {z, regulated}, new long[] {R2, Owners.request(3)}, new int[] {1, 1},
                    LeaseKind.OWNER, out, 0));
            byte[][] got = new byte[2][];
            for (int i = 0; i < 2; i++) {
                got[i] = PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(out[i])).toArray(ValueLayout.JAVA_BYTE);
            }
            if (!lyingVerify) {
                assertEquals(PageState.RETIRED, pool.view().stateOf(2), "the page whose scrub stuck is retired, not handed out");
                assertNotEquals(2, pool.view().pageOf(out[0]));
                assertNotEquals(2, pool.view().pageOf(out[1]));
            }
            return got;
        }
    }

    @Test
    void sealedPagesGoingToAStepWithAComplianceRowAreVerifiedZero() {
        for (byte[] page : sealedPagesHandedToACompliantRow(false)) {
            assertTrue(PageRecords.allZero(page), "every page of the step is verified zero");
        }
    }

    @Test
    void plantedBugAVerifyThatPassesEverythingHandsOutTheStuckByte() {
        byte[][] got = sealedPagesHandedToACompliantRow(true);
        assertFalse(PageRecords.allZero(got[0]) && PageRecords.allZero(got[1]), "twin: a page that is not zero reaches a tenant");
    }
}
