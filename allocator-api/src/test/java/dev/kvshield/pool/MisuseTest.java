package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.DoubleFreeException;
import dev.kvshield.handle.InvalidHandleException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handle.StaleHandleException;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.UnknownTenantException;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/** Misuse gets its specific error naming the values, is counted, and leaves the pool digest unchanged. */
class MisuseTest {
    private static <T extends Throwable> T rejectedUnchanged(KvPagePool pool, Class<T> type, Executable call, String... inMessage) {
        long before = pool.stateDigest();
        T e = assertThrows(type, call);
        assertEquals(before, pool.stateDigest(), "a rejected call changed the pool: " + e.getMessage());
        for (String s : inMessage) {
            assertTrue(e.getMessage().contains(s), "message '" + e.getMessage() + "' lacks '" + s + "'");
        }
        return e;
    }

    @Test
    void staleHandlesFailAcross100kReuseCyclesOfOnePage() {
        try (TestPools t = TestPools.create(2, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            long previous = PageHandles.NONE;
            List<Long> kept = new ArrayList<>();
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            for (int cycle = 0; cycle < 100_000; cycle++) {
                assertTrue(pool.allocate(a, Owners.request(cycle), LeaseKind.OWNER, 1, h, 0));
                assertEquals(1, pool.view().pageOf(h[0]));
                assertEquals(cycle + 1, PageHandles.generation(h[0]));
                if (previous != PageHandles.NONE && cycle % 100 == 0) {
                    long p = previous;
                    long r = cycle;
                    assertThrows(StaleHandleException.class, () -> pool.write(a, Owners.request(r), p, 0, 0, token));
                }
                if (cycle % 10_000 == 0) {
                    kept.add(h[0]);
                }
                pool.release(a, Owners.request(cycle), h, 0, 1, ReleaseReason.FINISHED);
                pool.endStep();
                previous = h[0];
            }
            long digest = pool.stateDigest();
            for (long old : kept) {
                assertThrows(StaleHandleException.class, () -> pool.release(a, Owners.request(0), new long[] {old}, 0, 1,
                        ReleaseReason.FINISHED));
            }
            assertEquals(digest, pool.stateDigest());
            assertEquals(100_001, pool.view().generationOf(1));
        }
    }

    @Test
    void doubleFreeIsNamedAndCounted() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            rejectedUnchanged(pool, DoubleFreeException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "double free", "page=1",
                    "generation=1", "current=2");
            pool.endStep();
            rejectedUnchanged(pool, DoubleFreeException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "already released", "FREE");
            rejectedUnchanged(pool, DoubleFreeException.class,
                    () -> pool.release(a, Owners.request(1), new long[] {h[1], h[1]}, 0, 2, ReleaseReason.FINISHED),
                    "listed twice");
            assertEquals(3.0, pool.metrics().rejections(Rejection.DOUBLE_FREE));
        }
    }

    @Test
    void aBatchWithOneBadHandleReleasesNothing() {
        try (TestPools t = TestPools.create(5, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[3];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0));
            long[] batch = {h[0], h[1], PageHandles.encode(h.length + 1, 1) + (1L << 32)};
            rejectedUnchanged(pool, InvalidHandleException.class,
                    () -> pool.release(a, Owners.request(1), batch, 0, 3, ReleaseReason.FINISHED), "foreign handle", "page=4");
            assertEquals(3, pool.snapshot().owned());
        }
    }

    @Test
    void releaseByANonOwnerIsForeignAccess() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            rejectedUnchanged(pool, ForeignAccessException.class,
                    () -> pool.release(b, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "owned by tenant 0 request 1",
                    "not by tenant 1 request 1");
            rejectedUnchanged(pool, ForeignAccessException.class,
                    () -> pool.release(a, Owners.request(2), h, 0, 1, ReleaseReason.FINISHED), "not by tenant 0 request 2");
            rejectedUnchanged(pool, ForeignAccessException.class,
                    () -> pool.read(b, Owners.request(7), h[0], 0, 0, MemorySegment.ofArray(new byte[8])), "neither its owner nor a reader");
            assertEquals(3.0, pool.metrics().rejections(Rejection.FOREIGN));
        }
    }

    @Test
    void garbageAndForeignHandlesAreInvalid() {
        List<PageEventType> events = new ArrayList<>();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(4), ProtectionLevel.ZERO,
                c -> c.listener((type, page, gen, tenant, owner, detail) -> events.add(type)), UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            SplittableRandom random = new SplittableRandom(20261202L);
            long[] garbage = {0L, -1L, Long.MIN_VALUE, Long.MAX_VALUE, 1L, PageHandles.encode(4, 1), PageHandles.encode(1, 99),
                    h[0] | 0x8000_0000L, random.nextLong(), random.nextLong(), random.nextLong()};
            for (long g : garbage) {
                rejectedUnchanged(pool, InvalidHandleException.class,
                        () -> pool.release(a, Owners.request(1), new long[] {g}, 0, 1, ReleaseReason.FINISHED));
            }
            assertEquals(garbage.length, pool.metrics().rejections(Rejection.INVALID));
            assertEquals(garbage.length, events.stream().filter(PageEventType::isRejection).count());
        }
    }

    @Test
    void badCountsOffsetsTenantsAndOwnersAreRejected() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> pool.allocate(a, Owners.request(1), LeaseKind.OWNER, -1, h, 0), "[0, -1)");
            rejectedUnchanged(pool, IllegalArgumentException.class,
                    () -> pool.allocate(a, Owners.request(1), LeaseKind.OWNER, Integer.MAX_VALUE, h, 0), "outside an array of 2");
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 2));
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, -1));
            rejectedUnchanged(pool, IllegalArgumentException.class,
                    () -> pool.release(a, Owners.request(1), h, 1, 5, ReleaseReason.FINISHED));
            rejectedUnchanged(pool, IllegalArgumentException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, -3, ReleaseReason.FINISHED));
            rejectedUnchanged(pool, UnknownTenantException.class, () -> pool.allocate(7, Owners.request(1), LeaseKind.OWNER, 1, h, 0),
                    "unknown tenant id 7", "1 registered");
            rejectedUnchanged(pool, UnknownTenantException.class, () -> pool.allocate(-1, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> pool.allocate(a, -5L, LeaseKind.OWNER, 1, h, 0), "invalid owner");
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> Owners.request(-1));
            rejectedUnchanged(pool, dev.kvshield.geometry.InvalidGeometryException.class,
                    () -> pool.write(a, Owners.request(1), h[0], 0, 0, MemorySegment.ofArray(new byte[7])), "7 bytes");
            rejectedUnchanged(pool, dev.kvshield.geometry.InvalidGeometryException.class,
                    () -> pool.write(a, Owners.request(1), h[0], 0, 3, MemorySegment.ofArray(new byte[16])), "slots [3, 5)");
            rejectedUnchanged(pool, dev.kvshield.geometry.InvalidGeometryException.class,
                    () -> pool.write(a, Owners.request(1), h[0], 99, 0, MemorySegment.ofArray(new byte[8])), "buffer 99");
        }
    }
}
