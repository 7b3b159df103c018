package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.metrics.MetricNames;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.TestPools;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * A listener that throws, an {@link Error} included, is counted and skipped: the call that emitted completes its whole
 * batch (the batch paths emit between their changes, so an Error escaping there left the pool half-changed: a boundary
 * batch finished again at every later boundary, a released page still counted against its tenant's quota, pages handed
 * out behind a call that threw).
 */
class ListenerErrorTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);

    private static double listenerFailures(KvPagePool pool) {
        return pool.config().meterRegistry().find(MetricNames.LISTENER_FAILURES).counters().stream().mapToDouble(c -> c.count())
                .sum();
    }

    private static TestPools tinyZeroPool() {
        return TestPools.create(TestPools.tinyGeometry(4), ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity());
    }

    @Test
    void anErrorOnABoundarysSecondPageFinishesTheBatchAndItsPagesComeBack() {
        AtomicInteger protectDone = new AtomicInteger();
        AtomicBoolean armed = new AtomicBoolean();
        try (TestPools t = tinyZeroPool()) {
            KvPagePool pool = t.pool;
            pool.addListener((type, page, generation, tenant, owner, detail) -> {
                if (type == PageEventType.PROTECT_DONE && armed.get() && protectDone.incrementAndGet() == 2) {
                    throw new AssertionError("listener bug on the second page of the batch");
                }
            });
            int a = pool.tenants().register("a");
            long[] leases = new long[3];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 3, leases, 0));
            pool.release(a, R1, leases, 0, 3, ReleaseReason.FINISHED);
            armed.set(true);
            pool.endStep();
            armed.set(false);
            assertEquals(1.0, listenerFailures(pool));
            pool.endStep(); // the batch is not finished again
            long[] again = new long[3];
            assertTrue(pool.allocate(a, R2, LeaseKind.OWNER, 3, again, 0), "the three protected pages are handed out again");
        }
    }

    @Test
    void anErrorOnAReleaseEventStillLowersTheTenantsOwnedCount() {
        AtomicBoolean armed = new AtomicBoolean();
        try (TestPools t = tinyZeroPool()) {
            KvPagePool pool = t.pool;
            pool.addListener((type, page, generation, tenant, owner, detail) -> {
                if (type == PageEventType.RELEASE && armed.getAndSet(false)) {
                    throw new AssertionError("listener bug");
                }
            });
            int a = pool.tenants().register("a", TenantPolicy.withQuota(1));
            long[] lease = new long[1];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 1, lease, 0));
            int page = pool.view().pageOf(lease[0]);
            armed.set(true);
            pool.release(a, R1, lease, 0, 1, ReleaseReason.FINISHED);
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(page));
            assertEquals(0, pool.ownedBy(a), "a quarantined page is owned by no one; the quota follows it");
            pool.endStep();
            assertTrue(pool.allocate(a, R2, LeaseKind.OWNER, 1, new long[1], 0), "the tenant's quota of one page is free again");
        }
    }

    @Test
    void anErrorOnAnAllocateEventStillHandsTheWholeBatchOut() {
        AtomicBoolean armed = new AtomicBoolean();
        try (TestPools t = tinyZeroPool()) {
            KvPagePool pool = t.pool;
            pool.addListener((type, page, generation, tenant, owner, detail) -> {
                if (type == PageEventType.ALLOCATE && armed.getAndSet(false)) {
                    throw new AssertionError("listener bug");
                }
            });
            int a = pool.tenants().register("a", TenantPolicy.withQuota(2));
            armed.set(true);
            long[] leases = new long[2];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 2, leases, 0));
            assertEquals(2, pool.ownedBy(a));
            for (long lease : leases) {
                assertTrue(pool.view().isLive(lease), "the caller holds every page it was handed");
            }
            assertEquals(1.0, listenerFailures(pool));
        }
    }
}
