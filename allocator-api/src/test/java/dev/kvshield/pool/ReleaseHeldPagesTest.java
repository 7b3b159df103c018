package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.UnknownTenantException;
import dev.kvshield.testing.TestPools;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * {@link KvPagePool#releaseHeldPages}: by pages, the same outcome (state and events) as {@link
 * KvPagePool#release} of the holder's leases on them; a page it does not hold changes nothing.
 */
class ReleaseHeldPagesTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);

    /** Two pools given the same calls: {@code a} releases by leases, {@code b} by pages. */
    private static final class Twins implements AutoCloseable {
        final TestPools a = TestPools.create(9, ProtectionLevel.ZERO);
        final TestPools b = TestPools.create(9, ProtectionLevel.ZERO);
        final List<String> eventsA = new ArrayList<>();
        final List<String> eventsB = new ArrayList<>();
        final int tenant;
        final long[] leases = new long[4];
        final int[] pages = new int[4];

        Twins() {
            a.pool.addListener(recorder(eventsA));
            b.pool.addListener(recorder(eventsB));
            tenant = a.pool.tenants().register("t");
            assertEquals(tenant, b.pool.tenants().register("t"));
            long[] other = new long[4];
            for (KvPagePool p : new KvPagePool[] {a.pool, b.pool}) {
                assertTrue(p.allocate(tenant, R1, LeaseKind.OWNER, 4, leases, 0));
                assertTrue(p.allocate(tenant, R2, LeaseKind.OWNER, 2, other, 0));
            }
            for (int i = 0; i < 4; i++) {
                pages[i] = a.pool.view().pageOf(leases[i]);
            }
        }

        @Override
        public void close() {
            a.close();
            b.close();
        }
    }

    private static PageEventListener recorder(List<String> out) {
        return (type, page, generation, tenant, owner, detail) -> out.add(type + " " + page + "@" + generation + " t" + tenant
                + " o" + owner + " d" + detail);
    }

    @Test
    void releasingByPagesEqualsReleasingTheLeases() {
        try (Twins t = new Twins()) {
            int[] order = {t.pages[2], t.pages[0], t.pages[3], t.pages[1]};
            long[] leasesInOrder = {t.leases[2], t.leases[0], t.leases[3], t.leases[1]};
            t.a.pool.release(t.tenant, R1, leasesInOrder, 0, 4, ReleaseReason.FINISHED);
            long[] found = new long[4];
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, order, 0, 4, ReleaseReason.FINISHED, found, 0));
            assertArrayEquals(leasesInOrder, found);
            assertEquals(t.a.pool.stateDigest(), t.b.pool.stateDigest());
            assertEquals(t.eventsA, t.eventsB);
            assertTrue(t.eventsB.stream().filter(e -> e.startsWith(PageEventType.RELEASE.name())).count() == 4);
            t.a.pool.endStep();
            t.b.pool.endStep();
            assertEquals(t.a.pool.stateDigest(), t.b.pool.stateDigest());
        }
    }

    @Test
    void aPageWithASecondHoldStaysOwnedAsWithRelease() {
        try (Twins t = new Twins()) {
            long[] reader = new long[1];
            for (TestPools p : new TestPools[] {t.a, t.b}) {
                p.pool.share(t.tenant, R1, t.leases, 1, 1, LeaseKind.READER, t.tenant, R2, reader, 0);
            }
            t.a.pool.release(t.tenant, R1, t.leases, 0, 2, ReleaseReason.FINISHED);
            long[] found = new long[2];
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 2, ReleaseReason.FINISHED, found, 0));
            assertEquals(t.a.pool.stateDigest(), t.b.pool.stateDigest());
            assertEquals(t.eventsA, t.eventsB);
        }
    }

    @Test
    void aPageTheHolderDoesNotHoldChangesNothingAndIsNamed() {
        try (Twins t = new Twins()) {
            int othersPage = t.pages[3] + 1; // R2's first page: allocated right after R1's four
            assertEquals(LeaseIds.NONE, t.b.pool.view().leaseOf(othersPage, t.tenant, R1, LeaseKind.OWNER));
            int pageCount = t.b.pool.geometry().pageCount();
            for (int foreign : new int[] {othersPage, 0, -1, pageCount, t.pages[0] + 100}) {
                int[] pages = {t.pages[0], foreign, t.pages[1]};
                long before = t.b.pool.stateDigest();
                int events = t.eventsB.size();
                long[] found = {7, 7, 7};
                assertFalse(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, pages, 0, 3, ReleaseReason.FINISHED, found, 0),
                        "page " + foreign);
                assertArrayEquals(new long[] {t.leases[0], LeaseIds.NONE, t.leases[1]}, found, "page " + foreign);
                assertEquals(before, t.b.pool.stateDigest(), "page " + foreign);
                assertEquals(events, t.eventsB.size(), "page " + foreign);
            }
            // another holder of the same tenant, and the right holder asking for another kind
            long[] found = new long[1];
            assertFalse(t.b.pool.releaseHeldPages(t.tenant, R2, LeaseKind.OWNER, t.pages, 0, 1, ReleaseReason.FINISHED, found, 0));
            assertFalse(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.NAMESPACE, t.pages, 0, 1, ReleaseReason.FINISHED, found, 0));
            // released already: a second release by pages is refused, nothing changes
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 1, ReleaseReason.FINISHED, found, 0));
            long before = t.b.pool.stateDigest();
            assertFalse(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 1, ReleaseReason.FINISHED, found, 0));
            assertEquals(LeaseIds.NONE, found[0]);
            assertEquals(before, t.b.pool.stateDigest());
        }
    }

    @Test
    void misuseThrowsBeforeAnythingChanges() {
        try (Twins t = new Twins()) {
            long before = t.b.pool.stateDigest();
            long[] found = new long[4];
            int[] twice = {t.pages[0], t.pages[1], t.pages[0]};
            DuplicateLeaseException d = assertThrows(DuplicateLeaseException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1,
                    LeaseKind.OWNER, twice, 0, 3, ReleaseReason.FINISHED, found, 0));
            assertTrue(d.getMessage().contains("listed twice"), d.getMessage());
            assertEquals(before, t.b.pool.stateDigest());
            assertThrows(IllegalArgumentException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.CLAIM_READER,
                    t.pages, 0, 1, ReleaseReason.FINISHED, found, 0));
            assertThrows(IllegalArgumentException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 1,
                    null, found, 0));
            assertThrows(UnknownTenantException.class, () -> t.b.pool.releaseHeldPages(99, R1, LeaseKind.OWNER, t.pages, 0, 1,
                    ReleaseReason.FINISHED, found, 0));
            assertThrows(IllegalArgumentException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 4,
                    ReleaseReason.FINISHED, new long[3], 0));
            assertEquals(before, t.b.pool.stateDigest());
        }
    }

    @Test
    void offsetsReadAndWriteOnlyTheirRangesAndCountZeroReleasesNothing() {
        try (Twins t = new Twins()) {
            int foreign = t.pages[3] + 1; // R2's: outside the range read, it must not refuse the call
            int[] pages = {foreign, t.pages[1], t.pages[2], foreign};
            long[] found = {7, 7, 7, 7, 7};
            long before = t.b.pool.stateDigest();
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, pages, 4, 0, ReleaseReason.FINISHED, found, 5));
            assertEquals(before, t.b.pool.stateDigest());
            assertThrows(IllegalArgumentException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, pages, 1,
                    Integer.MAX_VALUE, ReleaseReason.FINISHED, found, 0));
            assertThrows(IllegalArgumentException.class, () -> t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, pages, 1, 2,
                    ReleaseReason.FINISHED, found, 4));
            assertEquals(before, t.b.pool.stateDigest());
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, pages, 1, 2, ReleaseReason.FINISHED, found, 3));
            assertArrayEquals(new long[] {7, 7, 7, t.leases[1], t.leases[2]}, found);
            t.a.pool.release(t.tenant, R1, t.leases, 1, 2, ReleaseReason.FINISHED);
            assertEquals(t.a.pool.stateDigest(), t.b.pool.stateDigest());
            assertEquals(t.eventsA, t.eventsB);
        }
    }

    @Test
    void aPageListedTwiceThrowsWhetherOrNotTheHolderHoldsIt() {
        try (Twins t = new Twins()) {
            int othersPage = t.pages[3] + 1; // R2's: not R1's
            int freePage = t.b.pool.geometry().pageCount() - 1;
            long[] found = new long[4];
            for (int[] twice : new int[][] {{othersPage, othersPage}, {freePage, t.pages[0], freePage}, {0, 0},
                    {othersPage, t.pages[1], t.pages[1]}}) {
                long before = t.b.pool.stateDigest();
                DuplicateLeaseException d = assertThrows(DuplicateLeaseException.class, () -> t.b.pool.releaseHeldPages(t.tenant,
                        R1, LeaseKind.OWNER, twice, 0, twice.length, ReleaseReason.FINISHED, found, 0), java.util.Arrays.toString(twice));
                assertTrue(d.getMessage().contains("listed twice"), d.getMessage());
                assertEquals(before, t.b.pool.stateDigest());
            }
            // listed once each, the holder's pages still release: the marks of the refused calls are gone
            assertTrue(t.b.pool.releaseHeldPages(t.tenant, R1, LeaseKind.OWNER, t.pages, 0, 4, ReleaseReason.FINISHED, found, 0));
            assertArrayEquals(t.leases, found);
        }
    }

    /**
     * Seeded walks over shared pages (READER shares, DEFERRED_FREE holds, reader and writer claims,
     * fenced claims, quarantined and sealed pages, a tenant at its quota): every release by pages
     * leaves the state and events a look-up then {@link KvPagePool#release} leaves.
     */
    @Test
    void sharedClaimedQuarantinedAndSealedPagesReleaseAsTheLeasesWould() {
        for (ProtectionLevel level : new ProtectionLevel[] {ProtectionLevel.ZERO, ProtectionLevel.ENCRYPT}) {
            for (long seed = 1; seed <= 6; seed++) {
                walk(level, seed, false);
            }
        }
    }

    /** The walk's planted-bug twin: releasing by pages always as the owner (the kind ignored) must be caught. */
    @Test
    void theWalkCatchesAReleaseByPagesThatIgnoresTheKind() {
        assertThrows(org.opentest4j.AssertionFailedError.class, () -> walk(ProtectionLevel.ZERO, 1, true));
    }

    private static TestPools pool(ProtectionLevel level) {
        return TestPools.create(TestPools.tinyGeometry(10), level, c -> level == ProtectionLevel.ENCRYPT
                ? c.sealer(ctx -> new dev.kvshield.testing.EpochSealer(ctx.memory())) : c, UnaryOperator.identity());
    }

    private static void walk(ProtectionLevel level, long seed, boolean plantIgnoreKind) {
        java.util.Random rnd = new java.util.Random(seed);
        try (TestPools a = pool(level); TestPools b = pool(level)) {
            List<String> eventsA = new ArrayList<>();
            List<String> eventsB = new ArrayList<>();
            a.pool.addListener(recorder(eventsA));
            b.pool.addListener(recorder(eventsB));
            int[] tenants = new int[2];
            for (TestPools p : new TestPools[] {a, b}) {
                tenants[0] = p.pool.tenants().register("t");
                tenants[1] = p.pool.tenants().register("q", dev.kvshield.tenant.TenantPolicy.withQuota(3));
            }
            int pageCount = a.pool.geometry().pageCount();
            LeaseKind[] kinds = {LeaseKind.OWNER, LeaseKind.READER, LeaseKind.DEFERRED_FREE};
            List<long[]> claims = new ArrayList<>(); // tenant, holder, claim
            long[] one = new long[1];
            long[] out = new long[1];
            int released = 0;
            for (int step = 0; step < 300; step++) {
                String at = level + " seed " + seed + " step " + step;
                int tenant = tenants[rnd.nextInt(2)];
                long holder = Owners.request(1 + rnd.nextInt(3));
                int[] owned = held(a.pool, tenant, holder, LeaseKind.OWNER);
                one[0] = owned.length == 0 ? LeaseIds.NONE : a.pool.view().leaseOf(owned[rnd.nextInt(owned.length)], tenant, holder,
                        LeaseKind.OWNER);
                int op = rnd.nextInt(8);
                if (op == 0) {
                    int n = 1 + rnd.nextInt(3);
                    assertEquals(a.pool.allocate(tenant, holder, LeaseKind.OWNER, n, new long[n], 0),
                            b.pool.allocate(tenant, holder, LeaseKind.OWNER, n, new long[n], 0), at);
                } else if (op == 1 && one[0] != LeaseIds.NONE) {
                    long to = Owners.request(1 + rnd.nextInt(3));
                    both(at, p -> p.share(tenant, holder, one, 0, 1, LeaseKind.READER, tenant, to, out, 0), a, b);
                } else if (op == 2 && one[0] != LeaseIds.NONE) {
                    both(at, p -> p.transfer(tenant, holder, one, 0, 1, LeaseKind.DEFERRED_FREE, holder, out, 0), a, b);
                } else if (op == 3 && one[0] != LeaseIds.NONE) {
                    dev.kvshield.claims.ClaimKind k = rnd.nextBoolean() ? dev.kvshield.claims.ClaimKind.WRITER
                            : dev.kvshield.claims.ClaimKind.READER;
                    out[0] = LeaseIds.NONE;
                    both(at, p -> p.claim(tenant, holder, one, 0, 1, k, 7, out, 0), a, b);
                    if (out[0] != LeaseIds.NONE) {
                        claims.add(new long[] {tenant, holder, out[0]});
                    }
                } else if (op == 4 && !claims.isEmpty()) {
                    long[] c = claims.remove(rnd.nextInt(claims.size()));
                    boolean fence = rnd.nextBoolean();
                    if (fence) {
                        claims.add(c);
                    }
                    long[] id = {c[2]};
                    both(at, p -> {
                        if (fence) {
                            p.fenceClaims((int) c[0], c[1], id, 0, 1);
                        } else {
                            p.dropClaims((int) c[0], c[1], id, 0, 1);
                        }
                    }, a, b);
                } else if (op == 5) {
                    assertEquals(a.pool.endStep(), b.pool.endStep(), at);
                } else {
                    LeaseKind kind = kinds[rnd.nextInt(kinds.length)];
                    int[] mine = held(a.pool, tenant, holder, kind);
                    int stray = rnd.nextInt(4) == 0 ? rnd.nextInt(pageCount + 2) - 1 : -2; // sometimes a page it may not hold
                    int[] pages = java.util.stream.IntStream.concat(java.util.stream.IntStream.of(mine).limit(rnd.nextInt(4)),
                            java.util.stream.IntStream.of(stray).filter(x -> x > -2)).distinct().toArray();
                    int n = pages.length;
                    long[] leasesA = new long[n];
                    long[] leasesB = new long[n];
                    boolean heldA = a.pool.view().leasesOf(pages, 0, n, tenant, holder, kind, leasesA, 0) == n;
                    if (heldA) {
                        a.pool.release(tenant, holder, leasesA, 0, n, ReleaseReason.FINISHED);
                        released += n;
                    }
                    LeaseKind kindB = plantIgnoreKind ? LeaseKind.OWNER : kind;
                    assertEquals(heldA, b.pool.releaseHeldPages(tenant, holder, kindB, pages, 0, n, ReleaseReason.FINISHED, leasesB,
                            0), at);
                    assertArrayEquals(leasesA, leasesB, at);
                }
                assertEquals(a.pool.stateDigest(), b.pool.stateDigest(), at);
                assertEquals(eventsA, eventsB, at);
            }
            assertTrue(released > 20, level + " seed " + seed + ": the walk released " + released + " pages");
            for (PageEventType covered : new PageEventType[] {PageEventType.READER_REMOVED, PageEventType.HOLD_DROPPED,
                    PageEventType.CLAIM_FENCED}) {
                assertTrue(eventsB.stream().anyMatch(e -> e.startsWith(covered.name() + " ")), level + " seed " + seed + ": no " + covered);
            }
        }
    }

    /** The pages {@code (tenant, holder)} holds with {@code kind}, in page order. */
    private static int[] held(KvPagePool pool, int tenant, long holder, LeaseKind kind) {
        int pageCount = pool.geometry().pageCount();
        int[] all = java.util.stream.IntStream.range(0, pageCount).toArray();
        long[] found = new long[pageCount];
        pool.view().leasesOf(all, 0, pageCount, tenant, holder, kind, found, 0);
        return java.util.stream.IntStream.range(0, pageCount).filter(p -> found[p] != LeaseIds.NONE).toArray();
    }

    /** Runs {@code call} on both pools: the same outcome, or an exception of the same class. */
    private static void both(String at, java.util.function.Consumer<KvPagePool> call, TestPools a, TestPools b) {
        Class<?> failedA = null;
        Class<?> failedB = null;
        try {
            call.accept(a.pool);
        } catch (RuntimeException e) {
            failedA = e.getClass();
        }
        try {
            call.accept(b.pool);
        } catch (RuntimeException e) {
            failedB = e.getClass();
        }
        assertEquals(failedA, failedB, at);
    }

    /** A page handed out again starts a new generation: none of the slots its last generation wrote stays written. */
    @Test
    void aPageHandedOutAgainForgetsItsLastGenerationsSlotsInEveryWord() {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 2).pageSizeTokens(130).pageCount(4).build(); // three words a page
        try (TestPools t = TestPools.create(g, ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity())) {
            int tenant = t.pool.tenants().register("t");
            int n = g.pageCount() - 1; // every page the pool hands out (page 0 reserved), so each round reuses the last round's
            int[] tenants = {tenant};
            long[] holders = {R1};
            int[] counts = {n};
            long[] leases = new long[n];
            for (int lastWritten : new int[] {130, 65, 0, -1, 129}) { // -1: handed out by allocateRows, nothing written
                assertTrue(lastWritten < 0 ? t.pool.allocateRows(1, tenants, holders, counts, LeaseKind.OWNER, leases, 0)
                        : t.pool.allocateRowsWritten(1, tenants, holders, counts, new int[] {lastWritten}, LeaseKind.OWNER, leases, 0),
                        "round " + lastWritten);
                for (int i = 0; i < n; i++) {
                    int to = lastWritten < 0 ? 0 : i == n - 1 ? lastWritten : 130;
                    for (int slot = 0; slot < 130; slot++) {
                        assertEquals(slot < to, t.pool.view().isWritten(leases[i], slot, slot + 1), "written " + lastWritten + " page " + i
                                + " slot " + slot);
                    }
                }
                t.pool.release(tenant, R1, leases, 0, n, ReleaseReason.FINISHED);
                t.pool.endStep();
            }
        }
    }

    @Test
    void writtenSlotsOfHandedOutPagesMatchMarkingThemAcrossWords() {
        writtenSlotsMatch(ProtectionLevel.NONE, UnaryOperator.identity());
        // sealed pages, written whole in their last generation, cleared for the hand-out
        writtenSlotsMatch(ProtectionLevel.ENCRYPT, c -> c.sealer(ctx -> new dev.kvshield.testing.EpochSealer(ctx.memory())));
    }

    private static void writtenSlotsMatch(ProtectionLevel level, UnaryOperator<PoolConfig.Builder> config) {
        // 100 slots a page: two extent words, so a last page written to 0, 1, 64, 70 or 100 slots crosses the word edge
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 2).pageSizeTokens(100).pageCount(12).build();
        int[] lastWritten = {0, 1, 64, 70, 100};
        try (TestPools rows = TestPools.create(g, level, config, UnaryOperator.identity());
                TestPools marked = TestPools.create(g, level, config, UnaryOperator.identity());
                TestPools silent = TestPools.bare(g, level, config, UnaryOperator.identity())) {
            List<String> rowEvents = new ArrayList<>();
            List<String> markedEvents = new ArrayList<>();
            rows.pool.addListener(recorder(rowEvents));
            marked.pool.addListener(recorder(markedEvents));
            int tenant = 0;
            for (TestPools p : new TestPools[] {rows, marked, silent}) {
                tenant = p.pool.tenants().register("t");
                if (level == ProtectionLevel.ENCRYPT) { // every page written whole, released and sealed first
                    long[] all = new long[g.pageCount() - 1];
                    assertTrue(p.pool.allocate(tenant, R2, LeaseKind.OWNER, all.length, all, 0));
                    for (long lease : all) {
                        p.pool.markWritten(tenant, R2, lease, 0, 100);
                    }
                    p.pool.release(tenant, R2, all, 0, all.length, ReleaseReason.FINISHED);
                    p.pool.endStep();
                    for (int page = 1; page < g.pageCount(); page++) {
                        assertEquals(PageState.SEALED, p.pool.view().stateOf(page), "page " + page);
                    }
                }
            }
            int n = lastWritten.length;
            int[] tenants = new int[n];
            long[] holders = new long[n];
            int[] counts = new int[n];
            for (int r = 0; r < n; r++) {
                tenants[r] = tenant;
                holders[r] = Owners.request(r + 1);
                counts[r] = 2;
            }
            long[] leases = new long[2 * n];
            assertTrue(rows.pool.allocateRowsWritten(n, tenants, holders, counts, lastWritten, LeaseKind.OWNER, leases, 0));
            assertTrue(silent.pool.allocateRowsWritten(n, tenants, holders, counts, lastWritten, LeaseKind.OWNER, new long[2 * n], 0));
            long[] markedLeases = new long[2 * n];
            assertTrue(marked.pool.allocateRows(n, tenants, holders, counts, LeaseKind.OWNER, markedLeases, 0));
            for (int r = 0; r < n; r++) {
                marked.pool.markWritten(tenant, holders[r], markedLeases[2 * r], 0, 100);
                if (lastWritten[r] > 0) {
                    marked.pool.markWritten(tenant, holders[r], markedLeases[2 * r + 1], 0, lastWritten[r]);
                }
            }
            assertEquals(marked.pool.stateDigest(), rows.pool.stateDigest());
            assertEquals(marked.pool.stateDigest(), silent.pool.stateDigest());
            assertEquals(markedEvents, rowEvents);
            for (int r = 0; r < n; r++) {
                assertTrue(rows.pool.view().isWritten(leases[2 * r + 1], 0, lastWritten[r]), "row " + r);
                if (lastWritten[r] < 100) {
                    assertFalse(rows.pool.view().isWritten(leases[2 * r + 1], lastWritten[r], lastWritten[r] + 1), "row " + r);
                }
            }
        }
    }
}
