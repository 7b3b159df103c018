package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/** A page whose generation would wrap is scrubbed and retired forever, never reused. */
class GenerationExhaustionTest {
    @Test
    void pageIsRetiredWhenItsGenerationReachesTheLimit() {
        List<Long> retires = new ArrayList<>();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(2), ProtectionLevel.ZERO,
                c -> c.testingInitialGeneration(PageHandles.MAX_GENERATION - 2).listener((type, page, gen, tenant, owner, detail) -> {
                    if (type == PageEventType.RETIRE) {
                        retires.add(detail);
                    }
                }), UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            assertEquals(PageHandles.MAX_GENERATION - 2, PageHandles.generation(pool.view().handleOf(h[0])));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            long[] last = new long[1];
            assertTrue(pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, last, 0));
            assertEquals(PageHandles.MAX_GENERATION - 1, PageHandles.generation(pool.view().handleOf(last[0])));
            pool.write(a, Owners.request(2), last[0], 0, 0, Patterns.fill(arena, pool.geometry().pageBytes(0), a, 2, 1, 0));
            assertEquals(1, pool.available() + 1, "the page is owned; nothing else to give");
            pool.release(a, Owners.request(2), last, 0, 1, ReleaseReason.FINISHED);
            assertEquals(0, pool.available(), "a page heading for retirement is not counted as available");
            pool.endStep();
            assertEquals(PageState.RETIRED, pool.view().stateOf(1));
            assertEquals(PageHandles.MAX_GENERATION, pool.view().generationOf(1));
            assertEquals(List.of((long) RetireReason.GENERATION_EXHAUSTED.ordinal()), retires);
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, 1)), "retired pages are scrubbed too");
            for (int i = 0; i < 3; i++) {
                pool.endStep();
                assertFalse(pool.allocate(a, Owners.request(3), LeaseKind.OWNER, 1, h, 0), "a retired page is never reused");
            }
            assertThrows(dev.kvshield.lease.ReleasedLeaseException.class, () -> pool.markWritten(a, Owners.request(2), last[0], 0, 1));
            assertEquals(1, pool.snapshot().retired());
        }
    }
}
