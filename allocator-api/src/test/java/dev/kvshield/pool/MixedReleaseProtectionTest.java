package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.ValueLayout;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * One release that ends the last holds on pages of several tenants (a reader of two shared
 * namespaces) protects each page at its own tenant's level: the quarantine batches the pages per
 * (tenant, level) instead of giving the whole release the first page's. The page of the tenant whose
 * level scrubs is zero afterwards even when a page of a tenant whose level keeps bytes came first.
 */
class MixedReleaseProtectionTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);
    private static final long NS = Owners.namespace(0);

    /** The page of {@code tenant}'s shared namespace, its hold then given up, with {@code b}'s reader the last one. */
    private static long readerOnSharedPage(KvPagePool pool, Arena arena, int tenant, long pattern, int b) {
        long[] owner = Leases.allocateWritten(pool, arena, tenant, R1, 1, pattern);
        long[] ns = new long[1];
        pool.transfer(tenant, R1, owner, 0, 1, LeaseKind.NAMESPACE, NS, ns, 0);
        long reader = Leases.addReader(pool, tenant, NS, ns[0], b, R2);
        pool.release(tenant, NS, ns, 0, 1, ReleaseReason.EVICTED);
        return reader;
    }

    @Test
    void eachPageOfAMixedReleaseGetsItsOwnTenantsProtection() {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(5), ProtectionLevel.NONE, UnaryOperator.identity(),
                UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int open = pool.tenants().register("open-prompt");
            int scrubbed = pool.tenants().register("scrubbed-prompt", TenantPolicy.withLevel(ProtectionLevel.ZERO));
            int b = pool.tenants().register("b");
            pool.declareSharedNamespace(open);
            pool.declareSharedNamespace(scrubbed);
            long first = readerOnSharedPage(pool, arena, open, 1, b);
            long second = readerOnSharedPage(pool, arena, scrubbed, 2, b);
            int openPage = pool.view().pageOf(first);
            int scrubbedPage = pool.view().pageOf(second);
            pool.release(b, R2, new long[] {first, second}, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(openPage));
            assertEquals(PageState.FREE, pool.view().stateOf(scrubbedPage));
            assertTrue(PoolProbe.holdsPattern(t.memory, arena, openPage, open, 1), "NONE leaves the open prompt's bytes");
            assertFalse(PoolProbe.holdsPattern(t.memory, arena, scrubbedPage, scrubbed, 2),
                    "the ZERO tenant's page was protected as the first page's NONE");
            assertTrue(PoolProbe.rawPage(t.memory, arena, scrubbedPage).elements(ValueLayout.JAVA_BYTE)
                    .allMatch(s -> s.get(ValueLayout.JAVA_BYTE, 0) == 0), "the ZERO tenant's page is zero");
        }
    }

    /** Pages each tenant owns, counted page by page (what the pool's per-tenant counts must equal). */
    private static void assertOwnedCountsExact(KvPagePool pool, int... tenants) {
        for (int tenant : tenants) {
            int owned = 0;
            for (int p = 1; p < pool.geometry().pageCount(); p++) {
                owned += pool.view().tenantOf(p) == tenant ? 1 : 0;
            }
            assertEquals(owned, pool.ownedBy(tenant), "tenant " + tenant + "'s owned count");
        }
    }

    /**
     * Owned counts are updated once per run of one tenant's pages: a release whose pages alternate between
     * tenants in uneven runs, with a hold that is not the page's last in between, leaves every tenant's count
     * equal to a recount, so a tenant at its quota gets exactly its quota back. Fails with a run's count
     * charged to the next run's tenant or the last run's left out.
     */
    @Test
    void aReleaseOfInterleavedTenantRunsKeepsEveryTenantsOwnedCountExact() {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(12), ProtectionLevel.NONE, UnaryOperator.identity(),
                UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int open = pool.tenants().register("open-prompt");
            int scrubbed = pool.tenants().register("scrubbed-prompt", new TenantPolicy(3, ProtectionLevel.ZERO, false));
            int b = pool.tenants().register("b");
            pool.declareSharedNamespace(open);
            pool.declareSharedNamespace(scrubbed);
            long[] stillShared = Leases.allocateWritten(pool, arena, open, R1, 1, 7);
            long[] ns = new long[1];
            pool.transfer(open, R1, stillShared, 0, 1, LeaseKind.NAMESPACE, NS, ns, 0);
            long[] own = Leases.allocateWritten(pool, arena, b, R2, 2, 8);
            long[] held = {
                readerOnSharedPage(pool, arena, open, 1, b), readerOnSharedPage(pool, arena, open, 2, b),
                readerOnSharedPage(pool, arena, scrubbed, 3, b), Leases.addReader(pool, open, NS, ns[0], b, R2),
                readerOnSharedPage(pool, arena, open, 4, b), readerOnSharedPage(pool, arena, scrubbed, 5, b), own[0], own[1],
            };
            assertOwnedCountsExact(pool, open, scrubbed, b);
            assertEquals(2, pool.ownedBy(scrubbed));
            pool.release(b, R2, held, 0, held.length, ReleaseReason.FINISHED);
            assertOwnedCountsExact(pool, open, scrubbed, b);
            assertEquals(1, pool.ownedBy(open), "the page its namespace still holds");
            pool.endStep();
            int sharedPage = pool.view().pageOf(ns[0]);
            assertTrue(PoolProbe.holdsPattern(t.memory, arena, sharedPage, open, 7), "the page still held keeps its bytes");
            for (int i : new int[] {2, 5}) {
                int page = pool.view().pageOf(held[i]);
                assertTrue(PoolProbe.rawPage(t.memory, arena, page).elements(ValueLayout.JAVA_BYTE)
                        .allMatch(x -> x.get(ValueLayout.JAVA_BYTE, 0) == 0), "the ZERO tenant's page " + page + " is zero");
            }
            long[] again = new long[4];
            assertTrue(pool.allocate(scrubbed, R1, LeaseKind.OWNER, 3, again, 0), pool.lastShortfall());
            assertFalse(pool.allocate(scrubbed, R1, LeaseKind.OWNER, 1, again, 3));
            assertTrue(pool.lastShortfall().startsWith("quota exhausted: tenant " + scrubbed + " asked for 1 pages"), pool.lastShortfall());
            assertTrue(pool.lastShortfall().contains("owns 3 of a quota of 3"), pool.lastShortfall());
            assertOwnedCountsExact(pool, open, scrubbed, b);
        }
    }
}
