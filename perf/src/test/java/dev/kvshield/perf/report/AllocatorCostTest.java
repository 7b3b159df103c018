package dev.kvshield.perf.report;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.SimulationResult;
import dev.kvshield.perf.testing.SimFixtures;
import dev.kvshield.memory.ForwardingPageMemory;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The allocator's cost per step and its share of a model step, on fixed step times. */
class AllocatorCostTest {
    private static final double EXACT = 1e-9;

    /** A run whose steps took {@code allocatorNanos} in the allocator and {@code protectionNanos} protecting. */
    static SimulationResult run(long[] allocatorNanos, long[] protectionNanos) {
        long[] steps = new long[allocatorNanos.length];
        java.util.Arrays.fill(steps, 1_000_000);
        return new SimulationResult(Level.ZERO, 1, 1, 0, 0, 0, 0, 100, steps.length, 1_000_000L * steps.length, steps, allocatorNanos,
                protectionNanos, 0, 0, 0, 0, 0, 0, 0, -1, -1, Map.of(), null, -1, -1, -1);
    }

    /** A run that served {@code tokens} tokens in {@code wallNanos} (one step). */
    static SimulationResult timed(long tokens, long wallNanos) {
        return new SimulationResult(Level.ZERO, 1, 1, 0, 0, 0, 0, tokens, 1, wallNanos, new long[] {wallNanos}, new long[] {0},
                new long[] {0}, 0, 0, 0, 0, 0, 0, 0, -1, -1, Map.of(), null, -1, -1, -1);
    }

    /** 1..100 µs in some order; protection 25% of it. */
    static SimulationResult hundredSteps(long offsetNanos) {
        long[] allocator = new long[100];
        long[] protection = new long[100];
        for (int i = 0; i < 100; i++) {
            allocator[i] = (long) ((i * 37) % 100 + 1) * 1000 + offsetNanos;
            protection[i] = allocator[i] / 4;
        }
        return run(allocator, protection);
    }

    @Test
    void percentilesAndMeanPerRunThenMedianOverRuns() {
        AllocatorCost c = AllocatorCost.of(List.of(hundredSteps(0), hundredSteps(2000), hundredSteps(1000)));
        assertEquals(new Spread(51, 50, 52), c.p50Micros());
        assertEquals(new Spread(100, 99, 101), c.p99Micros());
        assertEquals(new Spread(51.5, 50.5, 52.5), c.meanMicros());
        assertEquals(0.25, c.protectionShare(), EXACT);
    }

    @Test
    void theShareOfAModelStepDividesTheMedians() {
        AllocatorCost c = AllocatorCost.of(List.of(hundredSteps(0)));
        AllocatorCost.Share tenMs = c.shareOfModelStep(10);
        assertEquals(50 / 10_000.0, tenMs.p50(), EXACT);
        assertEquals(99 / 10_000.0, tenMs.p99(), EXACT);
        assertEquals(50.5 / 10_000.0, tenMs.mean(), EXACT);
        assertEquals(99 / 2_500.0, c.shareOfModelStep(2.5).p99(), EXACT);
        for (double bad : new double[] {0, -1, Double.NaN, Double.POSITIVE_INFINITY}) {
            assertTrue(assertThrows(IllegalArgumentException.class, () -> c.shareOfModelStep(bad)).getMessage().contains(": " + bad), "" + bad);
        }
    }

    @Test
    void stepsWithoutAllocatorWorkCountAsZero() {
        AllocatorCost c = AllocatorCost.of(List.of(run(new long[] {0, 0, 0, 4000}, new long[] {0, 0, 0, 0})));
        assertEquals(0, c.p50Micros().median());
        assertEquals(4, c.p99Micros().median());
        assertEquals(1, c.meanMicros().median(), EXACT);
        assertEquals(0, c.protectionShare());
        assertThrows(IllegalArgumentException.class, () -> AllocatorCost.of(List.of()));
    }

    @Test
    void deviceMemoryIsTimedAroundCallsThatWaitForTheDevice() {
        try (OffHeapPageMemory host = OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(8));
                ForwardingPageMemory device = new ForwardingPageMemory(OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(8))) {
                    @Override
                    public boolean isHostAccessible() {
                        return false;
                    }
                }) {
            assertEquals(AllocatorCost.HOST_TIMING, AllocatorCost.timingSource(host));
            assertEquals(AllocatorCost.DEVICE_TIMING, AllocatorCost.timingSource(device));
            assertTrue(AllocatorCost.DEVICE_TIMING.contains("cuEventSynchronize") && AllocatorCost.DEVICE_TIMING.contains("no per-kernel"));
        }
    }
}
