package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static dev.kvshield.protection.ProtectionLevel.ZERO;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.TestPools;
import java.util.Arrays;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/** Exact page ids and free order on tiny pools, as SGLang's allocator tests assert them. */
class PoolScenarioTest {
    static int[] pages(KvPagePool pool, long[] leases) {
        return Arrays.stream(leases).mapToInt(pool.view()::pageOf).toArray();
    }

    @Test
    void pagesComeOutInAscendingOrderAndPageZeroNever() {
        try (TestPools t = TestPools.create(6, ZERO)) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[3];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0));
            assertArrayEquals(new int[] {1, 2, 3}, pages(t.pool, h));
            long[] h2 = new long[2];
            assertTrue(t.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 2, h2, 0));
            assertArrayEquals(new int[] {4, 5}, pages(t.pool, h2));
            assertEquals(PageState.RETIRED, t.pool.view().stateOf(0), "page 0 is reserved for padding");
            assertEquals(0, t.pool.available());
        }
    }

    @Test
    void exhaustedPoolAnswersNoneWithTheCountsAndChangesNothing() {
        try (TestPools t = TestPools.create(4, ZERO)) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[3];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            long digest = t.pool.stateDigest();
            long[] more = {7, 7};
            assertFalse(t.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 2, more, 0), "all or nothing: 1 free page cannot serve 2");
            assertArrayEquals(new long[] {7, 7}, more, "nothing written on none");
            assertEquals(digest, t.pool.stateDigest());
            String why = t.pool.lastShortfall();
            assertTrue(why.contains("pool exhausted") && why.contains("asked for 2") && why.contains("free=1")
                    && why.contains("owned=2") && why.contains("quarantined=0") && why.contains("retired=0"), why);
        }
    }

    @Test
    void releasedBatchIsReusedFirstInItsOwnOrderAfterTheStepBoundary() {
        try (TestPools t = TestPools.create(8, ZERO)) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[5];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 5, h, 0));
            long[] back = {h[2], h[0]};
            t.pool.release(a, Owners.request(1), back, 0, 2, ReleaseReason.FINISHED);
            PoolSnapshot s = t.pool.snapshot();
            assertEquals(2, s.free(), "pages 6 and 7 only");
            assertEquals(2, s.quarantined());
            assertEquals(4, s.available(), "queued pages count as available");
            assertEquals(2, t.pool.endStep());
            assertEquals(4, t.pool.snapshot().free());
            long[] again = new long[3];
            assertTrue(t.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 3, again, 0));
            assertArrayEquals(new int[] {3, 1, 6}, pages(t.pool, again), "released batch first, in release order, then the rest");
            assertEquals(2, PageHandles.generation(t.pool.view().handleOf(again[0])), "generation bumped once");
            assertTrue(again[0] > h[4], "lease ids only grow: the new hold's id is unlike any earlier one");
        }
    }

    @Test
    void allocateDrainsQueuedProtectionWhenShortInsteadOfAnsweringNone() {
        try (TestPools t = TestPools.create(3, ZERO)) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            t.pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.ABORTED);
            assertEquals(2, t.pool.available());
            long[] again = new long[2];
            assertTrue(t.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 2, again, 0));
            assertArrayEquals(new int[] {1, 2}, pages(t.pool, again));
        }
    }

    @Test
    void releaseLagHoldsPagesUntilTheirStepButKeepsThemAvailable() {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(4), ZERO, b -> b.releaseLagSteps(1), UnaryOperator.identity())) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            t.pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            assertEquals(0, t.pool.endStep(), "queued in step 0, lag 1: not collected at the end of step 0");
            assertEquals(PageState.QUARANTINED, t.pool.view().stateOf(1));
            assertEquals(3, t.pool.available());
            assertEquals(1, t.pool.endStep());
            assertEquals(PageState.FREE, t.pool.view().stateOf(1));
        }
    }

    @Test
    void tenantQuotaAnswersNoneNamingTheQuota() {
        try (TestPools t = TestPools.create(8, ZERO)) {
            int a = t.pool.tenants().register("a", TenantPolicy.withQuota(3));
            int b = t.pool.tenants().register("b");
            long[] h = new long[4];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            assertFalse(t.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 2, h, 2));
            assertTrue(t.pool.lastShortfall().contains("quota of 3"), t.pool.lastShortfall());
            assertTrue(t.pool.allocate(b, Owners.request(3), LeaseKind.OWNER, 4, h, 0), "other tenants are not limited by a's quota");
            assertEquals(2, t.pool.ownedBy(a));
        }
    }

    @Test
    void zeroPagesIsAnEmptySuccess() {
        try (TestPools t = TestPools.create(3, ZERO)) {
            int a = t.pool.tenants().register("a");
            long digest = t.pool.stateDigest();
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 0, new long[0], 0));
            t.pool.release(a, Owners.request(1), new long[0], 0, 0, ReleaseReason.FINISHED);
            assertEquals(digest, t.pool.stateDigest());
        }
    }

    @Test
    void ownershipMovesToTheTenantsCacheNamespaceAndOutlivesTheRequest() {
        try (TestPools t = TestPools.create(4, ZERO)) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(t.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            long cache = Owners.namespace(0);
            long[] cached = new long[2];
            t.pool.transfer(a, Owners.request(1), h, 0, 2, LeaseKind.NAMESPACE, cache, cached, 0);
            assertEquals(1, t.pool.view().generationOf(t.pool.view().pageOf(cached[0])), "a handover keeps the generation");
            org.junit.jupiter.api.Assertions.assertThrows(dev.kvshield.lease.ReleasedLeaseException.class,
                    () -> t.pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.FINISHED), "the request's leases ended");
            org.junit.jupiter.api.Assertions.assertThrows(dev.kvshield.lease.ForeignLeaseException.class,
                    () -> t.pool.release(a, Owners.request(1), cached, 0, 2, ReleaseReason.FINISHED), "the cache's are not its");
            assertEquals(2, t.pool.snapshot().owned());
            t.pool.release(a, cache, cached, 0, 2, ReleaseReason.EVICTED);
            assertEquals(2, t.pool.snapshot().quarantined());
        }
    }
}
