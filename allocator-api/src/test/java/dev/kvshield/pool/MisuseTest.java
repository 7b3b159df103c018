package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.lease.UnknownLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.ProtectionLevel;
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
    void staleLeasesFailAcross100kReuseCyclesOfOnePage() {
        try (TestPools t = TestPools.create(2, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            long previous = LeaseIds.NONE;
            List<Long> kept = new ArrayList<>();
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            for (int cycle = 0; cycle < 100_000; cycle++) {
                assertTrue(pool.allocate(a, Owners.request(cycle), LeaseKind.OWNER, 1, h, 0));
                assertEquals(1, pool.view().pageOf(h[0]));
                assertEquals(cycle + 1, PageHandles.generation(pool.view().handleOf(h[0])));
                if (previous != LeaseIds.NONE && cycle % 100 == 0) {
                    long p = previous;
                    long r = cycle - 1;
                    rejectedUnchanged(pool, ReleasedLeaseException.class, () -> pool.write(a, Owners.request(r), p, 0, 0, token),
                            "lease " + p, "page 1", "not held");
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
                assertThrows(ReleasedLeaseException.class, () -> pool.release(a, Owners.request(0), new long[] {old}, 0, 1,
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
            rejectedUnchanged(pool, ReleasedLeaseException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "lease " + h[0], "page 1",
                    "not held");
            pool.endStep();
            long[] next = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, next, 0));
            assertEquals(1, pool.view().pageOf(next[0]), "the page went to the same holder id again");
            rejectedUnchanged(pool, ReleasedLeaseException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "not held");
            rejectedUnchanged(pool, DuplicateLeaseException.class,
                    () -> pool.release(a, Owners.request(1), new long[] {h[1], h[1]}, 0, 2, ReleaseReason.FINISHED),
                    "listed twice");
            assertEquals(3.0, pool.metrics().rejections(Rejection.DOUBLE_FREE));
            assertEquals(PageState.OWNED, pool.view().stateOf(1), "the stale free did not touch the page's new hold");
        }
    }

    @Test
    void aBatchWithOneBadLeaseReleasesNothing() {
        try (TestPools t = TestPools.create(5, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[3];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0));
            long unminted = pool.view().leaseIds().encode(99, 4);
            long[] batch = {h[0], h[1], unminted};
            rejectedUnchanged(pool, UnknownLeaseException.class,
                    () -> pool.release(a, Owners.request(1), batch, 0, 3, ReleaseReason.FINISHED), "never minted", "page 4");
            assertEquals(3, pool.snapshot().owned());
        }
    }

    @Test
    void releaseByAnotherHolderIsForeign() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            rejectedUnchanged(pool, ForeignLeaseException.class,
                    () -> pool.release(b, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED), "held by tenant 0 request 1",
                    "not by tenant 1 request 1");
            rejectedUnchanged(pool, ForeignLeaseException.class,
                    () -> pool.release(a, Owners.request(2), h, 0, 1, ReleaseReason.FINISHED), "not by tenant 0 request 2");
            rejectedUnchanged(pool, ForeignLeaseException.class,
                    () -> pool.read(b, Owners.request(7), h[0], 0, 0, MemorySegment.ofArray(new byte[8])), "not by tenant 1 request 7");
            assertEquals(3.0, pool.metrics().rejections(Rejection.FOREIGN));
        }
    }

    @Test
    void garbageAndUnmintedLeasesAreUnknown() {
        List<PageEventType> events = new ArrayList<>();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(4), ProtectionLevel.ZERO,
                c -> c.listener((type, page, gen, tenant, owner, detail) -> events.add(type)), UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            SplittableRandom random = new SplittableRandom(20261202L);
            LeaseIds ids = pool.view().leaseIds();
            long[] garbage = {0L, -1L, Long.MIN_VALUE, Long.MAX_VALUE, 1L, ids.encode(2, 1), ids.encode(1, 3) + 1,
                    h[0] + (1L << ids.pageBits()), h[0] | Long.MIN_VALUE, random.nextLong(), random.nextLong(), random.nextLong()};
            for (long g : garbage) {
                rejectedUnchanged(pool, UnknownLeaseException.class,
                        () -> pool.release(a, Owners.request(1), new long[] {g}, 0, 1, ReleaseReason.FINISHED));
            }
            assertEquals(garbage.length, pool.metrics().rejections(Rejection.INVALID));
            assertEquals(garbage.length, events.stream().filter(PageEventType::isRejection).count());
        }
    }

    @Test
    void leaseKindsTheCallDoesNotTakeAreRefused() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            long claim = dev.kvshield.testing.Leases.claim(pool, a, Owners.request(1), h[0], dev.kvshield.claims.ClaimKind.READER, 9);
            rejectedUnchanged(pool, ForeignLeaseException.class,
                    () -> pool.release(a, Owners.request(1), new long[] {claim}, 0, 1, ReleaseReason.FINISHED), "CLAIM_READER",
                    "release takes");
            long reader = dev.kvshield.testing.Leases.addReader(pool, a, Owners.request(1), h[0], Owners.request(2));
            rejectedUnchanged(pool, ForeignLeaseException.class,
                    () -> pool.write(a, Owners.request(2), reader, 0, 0, MemorySegment.ofArray(new byte[8])), "READER");
            rejectedUnchanged(pool, ForeignLeaseException.class, () -> pool.dropClaims(a, Owners.request(1), h, 0, 1), "OWNER",
                    "expected a claim");
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
            rejectedUnchanged(pool, IllegalArgumentException.class, () -> pool.allocate(a, -5L, LeaseKind.OWNER, 1, h, 0), "cannot hold");
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
