package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Tenant A fills its pages with its pattern and releases them; tenant B gets the same pages and
 * reads the raw bytes. The oracle is on the bytes: zero under ZERO and COMPLIANCE, A's pattern
 * under NONE (the twin proving the check can fail), A's pattern again with a backend that skips the
 * scrub (the planted bug the check must catch).
 */
class ZeroAfterReleaseTest {
    /** Runs the scenario; returns the raw bytes B's pages hold right after B got them. */
    static MemorySegment[] residueSeenByNextTenant(TestPools t, Arena arena) {
        KvPagePool pool = t.pool;
        PoolGeometry g = pool.geometry();
        int a = pool.tenants().register("tenant-a");
        int b = pool.tenants().register("tenant-b");
        int usable = g.usablePages();
        long[] ha = new long[usable];
        assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, usable, ha, 0));
        for (long h : ha) {
            for (int buf = 0; buf < g.bufferCount(); buf++) {
                pool.write(a, Owners.request(1), h, buf, 0,
                        Patterns.fill(arena, g.pageBytes(buf), a, 1, pool.view().pageOf(h), buf));
            }
        }
        pool.release(a, Owners.request(1), ha, 0, usable, ReleaseReason.FINISHED);
        pool.endStep();
        long[] hb = new long[usable];
        assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, usable, hb, 0));
        MemorySegment[] raw = new MemorySegment[usable];
        for (int i = 0; i < usable; i++) {
            raw[i] = PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(hb[i]));
        }
        return raw;
    }

    static boolean allZero(MemorySegment[] pages) {
        for (MemorySegment p : pages) {
            if (!Patterns.allZero(p)) {
                return false;
            }
        }
        return true;
    }

    static boolean anyPatternOf(TestPools t, Arena arena, int tenant, long request) {
        for (int p = 1; p < t.pool.geometry().pageCount(); p++) {
            if (PoolProbe.holdsPattern(t.memory, arena, p, tenant, request)) {
                return true;
            }
        }
        return false;
    }

    @ParameterizedTest
    @EnumSource(value = ProtectionLevel.class, names = {"ZERO", "COMPLIANCE"})
    void nextTenantReadsOnlyZeros(ProtectionLevel level) {
        for (QuarantineMode mode : QuarantineMode.values()) {
            try (TestPools t = TestPools.create(TestPools.tinyGeometry(6), level, c -> c.quarantineMode(mode), UnaryOperator.identity());
                    Arena arena = Arena.ofConfined()) {
                assertTrue(allZero(residueSeenByNextTenant(t, arena)), level + " " + mode + ": B saw non-zero bytes");
            }
        }
    }

    @Test
    void underNoneTheNextTenantSeesThePreviousPattern() {
        try (TestPools t = TestPools.create(6, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            MemorySegment[] raw = residueSeenByNextTenant(t, arena);
            assertFalse(allZero(raw), "twin: without a scrub the check must see old bytes");
            assertTrue(anyPatternOf(t, arena, 0, 1), "tenant A's exact pattern is still in memory under NONE");
        }
    }

    @Test
    void plantedBugBackendThatSkipsTheScrubIsCaught() {
        UnaryOperator<PageMemory> skip = ForwardingPageMemory::skippingScrub;
        PoolGeometry g = TestPools.tinyGeometry(6);
        // Start-up scrub is skipped too; the pool is fresh memory, so only the release path matters.
        try (TestPools t = TestPools.create(g, ProtectionLevel.ZERO, UnaryOperator.identity(), skip); Arena arena = Arena.ofConfined()) {
            assertFalse(allZero(residueSeenByNextTenant(t, arena)), "a scrub-skipping backend must fail the zero check");
            assertTrue(anyPatternOf(t, arena, 0, 1));
        }
    }

    @Test
    void plantedBugUnderComplianceIsRetiredNotHandedOut() {
        UnaryOperator<PageMemory> skip = ForwardingPageMemory::skippingScrub;
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(4), ProtectionLevel.COMPLIANCE, UnaryOperator.identity(), skip);
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[3];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0));
            pool.write(a, Owners.request(1), h[1], 0, 0, Patterns.fill(arena, pool.geometry().pageBytes(0), a, 1, 2, 0));
            pool.release(a, Owners.request(1), h, 0, 3, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(1, pool.snapshot().retired(), "the page that still held data failed verify-zero and was retired");
            assertEquals(1.0, pool.metrics().verifyFailureCount());
            long[] hb = new long[3];
            assertFalse(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 3, hb, 0), "the dirty page is never handed out");
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 2, hb, 0));
            assertArrayEquals(new int[] {1, 3}, PoolScenarioTest.pages(t.pool, java.util.Arrays.copyOf(hb, 2)));
            for (int i = 0; i < 2; i++) {
                assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(hb[i]))));
            }
        }
    }
}
