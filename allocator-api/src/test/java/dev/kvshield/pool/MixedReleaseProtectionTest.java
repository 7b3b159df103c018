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
}
