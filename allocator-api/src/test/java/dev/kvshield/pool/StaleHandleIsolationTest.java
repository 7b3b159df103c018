package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handle.StaleHandleException;
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
    /** How a client turns its handle into one the pool checks; the planted bug drops the generation. */
    interface HandleView {
        long view(KvPagePool pool, long handle);
    }

    static final HandleView GENERATION_CHECKED = (pool, h) -> h;
    /** Planted bug: a pool that never bumps generations accepts any handle of the page as current. */
    static final HandleView GENERATION_NOT_BUMPED =
            (pool, h) -> PageHandles.encode(pool.view().pageOf(h), pool.view().generationOf(pool.view().pageOf(h)));

    /** Returns the bytes A's stale read got, or null if the pool refused it. */
    static MemorySegment staleRead(TestPools t, Arena arena, HandleView view, ProtectionLevel level) {
        KvPagePool pool = t.pool;
        int a = pool.tenants().register("a");
        int b = pool.tenants().register("b");
        long bytes = pool.geometry().pageBytes(0);
        long[] ha = new long[1];
        assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, ha, 0));
        pool.write(a, Owners.request(1), view.view(pool, ha[0]), 0, 0, Patterns.fill(arena, bytes, a, 1, 1, 0));
        pool.release(a, Owners.request(1), new long[] {view.view(pool, ha[0])}, 0, 1, ReleaseReason.FINISHED);
        pool.endStep();
        long[] hb = new long[1];
        assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
        assertEquals(pool.view().pageOf(ha[0]), pool.view().pageOf(hb[0]), "LIFO reuse hands B the same page");
        pool.write(b, Owners.request(2), hb[0], 0, 0, Patterns.fill(arena, bytes, b, 2, 1, 0));
        // A is no longer the owner, so a stale read by A can only succeed where generations are blind
        // and A poses with B's identity, as a confused engine would by reusing a slot list.
        MemorySegment got = arena.allocate(bytes);
        try {
            pool.read(b, Owners.request(2), view.view(pool, ha[0]), 0, 0, got);
            return got;
        } catch (StaleHandleException e) {
            assertEquals(1.0, pool.metrics().rejections(Rejection.STALE));
            return null;
        }
    }

    static boolean leaked(MemorySegment got) {
        return got != null && Patterns.matches(got, 1, 2, 1, 0);
    }

    @Test
    void staleHandleCannotReadTheNextOwnersBytes() {
        for (ProtectionLevel level : new ProtectionLevel[] {ProtectionLevel.NONE, ProtectionLevel.ZERO}) {
            try (TestPools t = TestPools.create(2, level); Arena arena = Arena.ofConfined()) {
                assertFalse(leaked(staleRead(t, arena, GENERATION_CHECKED, level)), level + ": stale read leaked");
            }
        }
    }

    @Test
    void plantedBugPoolWithoutGenerationBumpLeaks() {
        try (TestPools t = TestPools.create(2, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            assertTrue(leaked(staleRead(t, arena, GENERATION_NOT_BUMPED, ProtectionLevel.ZERO)),
                    "twin: without generations the stale read returns tenant B's bytes");
        }
    }

    @Test
    void everyOperationOnAStaleHandleFailsNamingBothGenerations() {
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
            StaleHandleException e = assertThrows(StaleHandleException.class,
                    () -> pool.write(a, Owners.request(1), h[0], 0, 0, token));
            assertEquals("stale handle: page=1 generation=1 current=2 state=OWNED", e.getMessage());
            assertThrows(StaleHandleException.class, () -> pool.read(a, Owners.request(1), h[0], 0, 0, token));
            assertThrows(StaleHandleException.class, () -> pool.markWritten(a, Owners.request(1), h[0], 0, 1));
            assertThrows(StaleHandleException.class,
                    () -> Leases.claim(pool, a, Owners.request(1), h[0], dev.kvshield.claims.ClaimKind.WRITER, 9));
            assertThrows(StaleHandleException.class,
                    () -> pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED));
            assertEquals(digest, pool.stateDigest());
        }
    }
}
