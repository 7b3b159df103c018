package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * A failing backend keeps pages out of FREE for good: the failed batch's pages are held in the
 * quarantine (pool state, never a local), scrubbed at the next boundary and retired, counted and
 * reported; a scrub that fails again keeps them there for the boundary after.
 */
class ProtectionFailureTest {
    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void failedScrubKeepsPagesQuarantinedUntilAScrubSucceedsThenRetiresThem(QuarantineMode mode) {
        AtomicBoolean broken = new AtomicBoolean();
        List<PageEventType> events = new ArrayList<>();
        List<Long> retires = new ArrayList<>();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO,
                c -> c.quarantineMode(mode).listener((type, page, gen, tenant, owner, detail) -> {
                    events.add(type);
                    if (type == PageEventType.RETIRE) {
                        retires.add(detail);
                    }
                }),
                m -> failing(m, broken)); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            for (long handle : h) {
                pool.write(a, Owners.request(1), handle, 0, 0, Patterns.fill(arena, pool.geometry().pageBytes(0), a, 1, 1, 0));
            }
            broken.set(true);
            pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(2, pool.snapshot().failed());
            assertEquals(0, pool.available(), "failed pages are not promised to anyone");
            assertFalse(pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, new long[1], 0));
            assertTrue(events.contains(PageEventType.PROTECT_FAILED));
            assertEquals(2.0, pool.metrics().protectionFailureCount());
            pool.endStep();
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(1), "still failing: still quarantined, still failed");
            assertEquals(2, pool.snapshot().failed(), "the failed pages are never lost from the pool's state");
            broken.set(false);
            pool.endStep();
            assertEquals(PageState.RETIRED, pool.view().stateOf(1), "scrubbed, then retired: never back to FREE");
            assertEquals(PageState.RETIRED, pool.view().stateOf(2));
            assertEquals(0, pool.snapshot().failed());
            assertEquals(2, pool.snapshot().retired());
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, 1)));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, 2)));
            assertEquals(2, retires.stream().filter(r -> r == RetireReason.PROTECTION_FAILED.ordinal()).count());
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void anUnavailableKeySourceScrubsAndRetiresThePageNeverLeavingPlaintext(QuarantineMode mode) {
        AtomicBoolean keysDown = new AtomicBoolean();
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(3);
        try (PageMemory memory = dev.kvshield.memory.offheap.OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(dev.kvshield.pool.PoolConfig.builder(g).level(ProtectionLevel.ENCRYPT)
                        .quarantineMode(mode).sealer(ctx -> new dev.kvshield.testing.TestXorSealer(ctx.memory()) {
                            @Override
                            public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
                                if (keysDown.get()) {
                                    throw new dev.kvshield.protection.ProtectionException("key source unavailable for tenant " + tenant);
                                }
                                return super.seal(tenant, pages, generations, offset, count);
                            }
                        }).build(), memory);
                Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.write(a, Owners.request(1), h[0], 0, 0, Patterns.fill(arena, g.pageBytes(0), a, 1, 1, 0));
            keysDown.set(true);
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.RETIRED, pool.view().stateOf(1), "no key, no seal: scrubbed and retired");
            assertTrue(Patterns.allZero(PoolProbe.rawPage(memory, arena, 1)), "no plaintext left behind");
            assertEquals(0, pool.snapshot().failed());
            assertEquals(1, pool.available(), "page 2 only: the failed page is never offered");
            assertTrue(pool.metrics().protectionFailureCount() >= 1.0);
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void anErrorInsideTheBackendFailsTheBatchWithoutKillingTheWorker(QuarantineMode mode) {
        AtomicBoolean once = new AtomicBoolean(true);
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO, c -> c.quarantineMode(mode),
                m -> new ForwardingPageMemory(m) {
                    private boolean started;

                    @Override
                    public void scrub(int[] pages, int offset, int count) {
                        if (started && once.getAndSet(false)) {
                            throw new OutOfMemoryError("injected: worker-killing error inside the backend");
                        }
                        started = true;
                        super.scrub(pages, offset, count);
                    }
                })) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.RETIRED, pool.view().stateOf(1), "the failed batch's page is scrubbed and retired");
            long[] next = new long[1];
            assertTrue(pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, next, 0));
            pool.release(a, Owners.request(2), next, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(2), "the same worker protects the next batch");
        }
    }
    /**
     * A failed protection batch's pages are never promised: synchronously the failure is known at submit and {@code
     * available()} drops them then; asynchronously it arrives in the background, so they count until the boundary, but
     * an allocation that needs them awaits the batch first and answers "none" with the pool unchanged (it drained only
     * once it knew the drain would meet it).
     */
    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void aFailedBatchIsNeverHandedOutAndTheNoneAfterItChangesNothing(QuarantineMode mode) {
        AtomicBoolean broken = new AtomicBoolean();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO, c -> c.quarantineMode(mode),
                m -> failing(m, broken))) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] leases = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, leases, 0));
            broken.set(true); // NOTE: until after the allocation: the worker may protect the batch any time before it
            pool.release(a, Owners.request(1), leases, 0, 2, ReleaseReason.FINISHED);
            int promised = pool.available();
            long before = pool.stateDigest();
            assertFalse(pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, new long[1], 0), "the only pages failed protection");
            assertEquals(before, pool.stateDigest(), "a \"none\" leaves the pool as it was");
            if (mode == QuarantineMode.SYNCHRONOUS) {
                assertEquals(0, promised, "a batch that failed at submit is not promised");
            }
            broken.set(false);
        }
    }


    static PageMemory failing(PageMemory m, AtomicBoolean broken) {
        return new ForwardingPageMemory(m) {
            @Override
            public void scrub(int[] pages, int offset, int count) {
                if (broken.get()) {
                    // Half the work lands before the fault: the page must still not be reused.
                    super.scrub(pages, offset, count / 2);
                    throw new IllegalStateException("injected backend fault after " + count / 2 + " of " + count + " pages");
                }
                super.scrub(pages, offset, count);
            }
        };
    }
}
