package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.TestPools;
import dev.kvshield.testing.TestXorSealer;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * A batch call checks and applies one copy of the caller's arrays: an array that changes during the call's call-outs
 * (a sealer's {@code canSeal}, the quarantine drain's listeners; standing in here for another engine thread reusing its
 * buffer) changes nothing the call does. Read twice, a release of tenant a's page released tenant b's, and a row checked
 * against one tenant's quota was handed out to another.
 */
class CallerArraysTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);

    @Test
    void aReleaseOfPagesAppliesThePagesItChecked() {
        PoolGeometry g = TestPools.tinyGeometry(4);
        AtomicReference<int[]> swap = new AtomicReference<>();
        AtomicInteger foreignPage = new AtomicInteger(-1);
        try (PageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ENCRYPT)
                        .sealer(ctx -> new TestXorSealer(ctx.memory()) {
                            @Override
                            public boolean canSeal(int tenant) {
                                int[] pages = swap.getAndSet(null);
                                if (pages != null) {
                                    pages[0] = foreignPage.get(); // what a concurrent writer of the caller's array does
                                }
                                return super.canSeal(tenant);
                            }
                        }).build(), memory)) {
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] la = new long[1];
            long[] lb = new long[1];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 1, la, 0));
            assertTrue(pool.allocate(b, R2, LeaseKind.OWNER, 1, lb, 0));
            int pageA = pool.view().pageOf(la[0]);
            int pageB = pool.view().pageOf(lb[0]);
            foreignPage.set(pageB);
            int[] pages = {pageA};
            swap.set(pages);
            pool.releaseHeldPages(a, R1, LeaseKind.OWNER, pages, 0, 1, ReleaseReason.FINISHED, new long[1], 0);
            assertEquals(PageState.OWNED, pool.view().stateOf(pageB), "tenant b's page is not tenant a's to release");
            assertTrue(pool.view().isLive(lb[0]), "tenant b's lease stays live");
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(pageA), "tenant a's checked page is the one released");
        }
    }

    @Test
    void aRowHandOutAppliesTheRowsItChecked() {
        AtomicReference<int[]> swap = new AtomicReference<>();
        AtomicInteger swapTo = new AtomicInteger(-1);
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(4), ProtectionLevel.ZERO, UnaryOperator.identity(),
                UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            pool.addListener((type, page, generation, tenant, owner, detail) -> {
                int[] rows = type == PageEventType.PROTECT_DONE ? swap.getAndSet(null) : null;
                if (rows != null) {
                    rows[0] = swapTo.get(); // what a concurrent writer of the caller's array does
                }
            });
            int a = pool.tenants().register("a", TenantPolicy.withQuota(1));
            int b = pool.tenants().register("b");
            long[] la = new long[1];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 1, la, 0));
            long[] lb = new long[2];
            assertTrue(pool.allocate(b, R2, LeaseKind.OWNER, 2, lb, 0));
            pool.release(b, R2, lb, 0, 2, ReleaseReason.FINISHED); // queued, not yet collected: the next hand-out drains
            int[] tenantsOfRows = {b};
            swapTo.set(a);
            swap.set(tenantsOfRows);
            long[] out = new long[1];
            pool.allocateRows(1, tenantsOfRows, new long[] {Owners.request(3)}, new int[] {1}, LeaseKind.OWNER, out, 0);
            assertEquals(1, pool.ownedBy(a), "tenant a's quota is 1 page");
            assertEquals(1, pool.ownedBy(b), "the checked row was tenant b's");
        }
    }
}
