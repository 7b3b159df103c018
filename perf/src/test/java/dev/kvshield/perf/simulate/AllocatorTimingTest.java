package dev.kvshield.perf.simulate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.testing.SimFixtures;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.memory.ForwardingPageMemory;
import org.junit.jupiter.api.Test;

/**
 * What the simulation's per-step allocator time covers: a device-like backend (not host
 * accessible) whose every scrub takes at least 2 ms puts at least that much into the allocator time
 * of the steps that released pages, inside each step's own time.
 */
class AllocatorTimingTest {
    private static final long SCRUB_NANOS = 2_000_000;
    private static final SimulationOptions OPTIONS = new SimulationOptions(4, 64, 1, false);

    /** A device stand-in: not host accessible, each scrub batch sleeps 2 ms once the pool is built. */
    static final class SlowDevice extends ForwardingPageMemory {
        boolean started;
        int scrubs;

        SlowDevice(PageMemory delegate) {
            super(delegate);
        }

        @Override
        public boolean isHostAccessible() {
            return false;
        }

        @Override
        public void scrub(int[] pages, int offset, int count) {
            super.scrub(pages, offset, count);
            if (started && count > 0) {
                scrubs++;
                try {
                    Thread.sleep(SCRUB_NANOS / 1_000_000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException(e);
                }
            }
        }
    }

    @Test
    void theBackendsBatchTimeIsInsideTheAllocatorTimeOfItsStep() {
        Trace trace = SimFixtures.tinyTrace(SimFixtures.SEED);
        try (SlowDevice memory = new SlowDevice(OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(48)));
                ServingPool pool = PoolFactory.synchronous(null).create(Level.ZERO, memory)) {
            memory.started = true;
            Simulator simulator = new Simulator(pool, null, trace, OPTIONS);
            while (simulator.step()) {
                // every step of the trace
            }
            int scrubsInSteps = memory.scrubs; // finish() releases the resident prefixes outside any step
            SimulationResult r = simulator.finish();
            assertTrue(scrubsInSteps > 0, "the trace releases pages");
            long allocator = 0;
            long protection = 0;
            long wall = 0;
            for (int i = 0; i < r.steps(); i++) {
                assertTrue(r.allocatorStepNanos()[i] <= r.stepNanos()[i], "step " + i + ": allocator time is part of the step");
                allocator += r.allocatorStepNanos()[i];
                protection += r.protectionStepNanos()[i];
                wall += r.stepNanos()[i];
            }
            assertTrue(protection >= scrubsInSteps * SCRUB_NANOS, protection + " ns for " + scrubsInSteps + " scrubs");
            assertTrue(allocator >= protection, "synchronous protection is inside the allocator's calls");
            assertEquals(wall, r.wallNanos(), "serving time is the sum of the steps");
        }
    }

    @Test
    void stepByStepIsTheSameRunAndFinishingEarlyIsRefused() {
        Trace trace = SimFixtures.tinyTrace(SimFixtures.SEED);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(48));
                ServingPool pool = PoolFactory.synchronous(null).create(Level.NONE, memory)) {
            Simulator s = new Simulator(pool, null, trace, OPTIONS);
            assertTrue(s.step());
            IllegalStateException early = assertThrows(IllegalStateException.class, s::finish);
            assertTrue(early.getMessage().startsWith("finish() called at step 1 with "), early.getMessage());
            int steps = 1;
            while (s.step()) {
                steps++;
            }
            SimulationResult stepped = s.finish();
            assertEquals(steps, stepped.steps());
            try (OffHeapPageMemory other = OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(48));
                    ServingPool again = PoolFactory.synchronous(null).create(Level.NONE, other)) {
                SimulationResult whole = new Simulator(again, null, trace, OPTIONS).run();
                assertEquals(whole.steps(), stepped.steps());
                assertEquals(whole.tokens(), stepped.tokens());
                assertEquals(whole.pagesReused(), stepped.pagesReused());
            }
        }
    }
}
