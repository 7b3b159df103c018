package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Test;

/**
 * A stale reader: tenant A keeps its handle after release; the page goes to tenant B, who writes
 * its own data; A reads through the old handle. With generations the read fails; a planted-bug
 * pool that does not bump generations (every handle of a page looks current) hands A tenant B's
 * bytes, and the same byte oracle must see that leak.
 */
class StaleHandleIsolationTest {
    /** How a client turns the lease it kept into the one it presents; the planted bug looks up the page's current hold. */
    interface LeaseView {
        long view(KvPagePool pool, long lease, int tenant, long holder);
    }

    static final LeaseView AS_KEPT = (pool, lease, tenant, holder) -> lease;
    /**
     * Planted bug: an adapter that keeps page ids instead of leases and presents whatever hold the
     * page has now for the identity it poses as (the bare-slot-free class of bug).
     */
    static final LeaseView CURRENT_HOLD_OF_THE_PAGE = (pool, lease, tenant, holder) -> {
        long current = pool.view().leaseOf(pool.view().pageOf(lease), tenant, holder, LeaseKind.OWNER);
        return current != LeaseIds.NONE ? current : lease;
    };

    /** Returns the bytes A's stale read got, or null if the pool refused it. */
    static MemorySegment staleRead(TestPools t, Arena arena, LeaseView view, ProtectionLevel level) {
        KvPagePool pool = t.pool;
        int a = pool.tenants().register("a");
        int b = pool.tenants().register("b");
        long bytes = pool.geometry().pageBytes(0);
        long[] ha = new long[1];
        assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, ha, 0));
        pool.write(a, Owners.request(1), ha[0], 0, 0, Patterns.fill(arena, bytes, a, 1, 1, 0));
        pool.release(a, Owners.request(1), ha, 0, 1, ReleaseReason.FINISHED);
        pool.endStep();
        long[] hb = new long[1];
        assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
        assertEquals(pool.view().pageOf(ha[0]), pool.view().pageOf(hb[0]), "LIFO reuse hands B the same page");
        pool.write(b, Owners.request(2), hb[0], 0, 0, Patterns.fill(arena, bytes, b, 2, 1, 0));
        // A is no longer the owner, so a stale read by A can only succeed where generations are blind
        // and A poses with B's identity, as a confused engine would by reusing a slot list.
        MemorySegment got = arena.allocate(bytes);
        try {
            pool.read(b, Owners.request(2), view.view(pool, ha[0], b, Owners.request(2)), 0, 0, got);
            return got;
        } catch (ReleasedLeaseException e) {
            assertEquals(1.0, pool.metrics().rejections(Rejection.DOUBLE_FREE), "a released lease counts as presented twice");
            return null;
        }
    }

    static boolean leaked(MemorySegment got) {
        return got != null && Patterns.matches(got, 1, 2, 1, 0);
    }

    @Test
    void aReleasedLeaseCannotReadTheNextOwnersBytes() {
        for (ProtectionLevel level : new ProtectionLevel[] {ProtectionLevel.NONE, ProtectionLevel.ZERO}) {
            try (TestPools t = TestPools.create(2, level); Arena arena = Arena.ofConfined()) {
                assertFalse(leaked(staleRead(t, arena, AS_KEPT, level)), level + ": stale read leaked");
            }
        }
    }

    @Test
    void plantedBugAdapterPresentingThePagesCurrentHoldLeaks() {
        try (TestPools t = TestPools.create(2, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            assertTrue(leaked(staleRead(t, arena, CURRENT_HOLD_OF_THE_PAGE, ProtectionLevel.ZERO)),
                    "twin: an adapter that maps pages to their current hold returns tenant B's bytes to A's stale reference");
        }
    }

    @Test
    void everyOperationOnAReleasedLeaseFailsNamingIt() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            long[] h2 = new long[1];
            pool.endStep();
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h2, 0));
            long digest = pool.stateDigest();
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            assertEquals(pool.view().pageOf(h[0]), pool.view().pageOf(h2[0]), "the same holder id got the same page back");
            ReleasedLeaseException e = assertThrows(ReleasedLeaseException.class,
                    () -> pool.write(a, Owners.request(1), h[0], 0, 0, token));
            assertEquals("lease " + h[0] + " on page 1 is not held: it was released or presented already (ids are never reused)",
                    e.getMessage());
            assertThrows(ReleasedLeaseException.class, () -> pool.read(a, Owners.request(1), h[0], 0, 0, token));
            assertThrows(ReleasedLeaseException.class, () -> pool.markWritten(a, Owners.request(1), h[0], 0, 1));
            assertThrows(ReleasedLeaseException.class,
                    () -> Leases.claim(pool, a, Owners.request(1), h[0], dev.kvshield.claims.ClaimKind.WRITER, 9));
            assertThrows(ReleasedLeaseException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED));
            assertEquals(digest, pool.stateDigest());
        }
    }
}
