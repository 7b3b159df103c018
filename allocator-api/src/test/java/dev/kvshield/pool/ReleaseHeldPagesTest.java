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

    @Test
    void writtenSlotsOfHandedOutPagesMatchMarkingThemAcrossWords() {
        // 100 slots a page: two extent words, so a last page written to 0, 1, 64, 70 or 100 slots crosses the word edge
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 2).pageSizeTokens(100).pageCount(12).build();
        int[] lastWritten = {0, 1, 64, 70, 100};
        try (TestPools rows = TestPools.create(g, ProtectionLevel.NONE, UnaryOperator.identity(), UnaryOperator.identity());
                TestPools marked = TestPools.create(g, ProtectionLevel.NONE, UnaryOperator.identity(), UnaryOperator.identity());
                TestPools silent = TestPools.bare(g, ProtectionLevel.NONE, UnaryOperator.identity(), UnaryOperator.identity())) {
            List<String> rowEvents = new ArrayList<>();
            List<String> markedEvents = new ArrayList<>();
            rows.pool.addListener(recorder(rowEvents));
            marked.pool.addListener(recorder(markedEvents));
            int tenant = 0;
            for (TestPools p : new TestPools[] {rows, marked, silent}) {
                tenant = p.pool.tenants().register("t");
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
