package dev.kvshield.perf.report;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.SimulationResult;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** One level's figures from fixed timed runs and per-pair ratios. */
class SummariseTest {
    /** A run of 4 steps of {@code stepMicros} each, {@code tokens} tokens, 1 µs of allocator time per step. */
    static SimulationResult run(long stepMicros, long tokens) {
        long[] steps = {stepMicros * 1000, stepMicros * 1000, stepMicros * 1000, stepMicros * 2000};
        long wall = stepMicros * 5000;
        return new SimulationResult(Level.ZERO, 1, 1, 0, 0, 0, 0, tokens, 4, wall, steps, new long[] {1000, 1000, 1000, 1000},
                new long[] {500, 500, 500, 500}, 0, 0, 0, 0, 0, 2_000_000, 0.001, -1, -1, Map.of(), null, -1, -1, -1);
    }

    @Test
    void theRatioIsTheMedianOfThePairsWithTheirRange() {
        List<SimulationResult> runs = List.of(run(1000, 500), run(2000, 500), run(1000, 1000));
        LevelReport l = ReportRunner.summarise(Level.ZERO, runs, new double[] {0.96, 0.95, 0.97}, null, new Spread(20, 10, 30), null);
        assertEquals(new Spread(0.96, 0.95, 0.97), l.ratioToStock());
        assertArrayEquals(new double[] {0.96, 0.95, 0.97}, l.ratioPairs());
        assertFalse(l.withinNoise(), "every pair is below 1: a cost");
        // tokens ÷ (5 steps' worth of time): 500 / 5 ms, 500 / 10 ms, 1000 / 5 ms
        assertEquals(new Spread(100_000, 50_000, 200_000), l.tokensPerSecond());
        assertEquals(new Spread(1, 1, 2), l.stepP50Millis());
        assertEquals(new Spread(2, 2, 4), l.stepP99Millis());
        assertEquals(new Spread(1, 1, 1), l.allocator().p50Micros());
        assertEquals(0.5, l.allocator().protectionShare());
        // 2 MB protected in 1 ms: 2 GB/s; against the memset limit's median
        assertEquals(2.0, l.protectionGBps(), 1e-9);
        assertEquals("memset", l.limitName());
        assertEquals(20.0, l.limitGBps());
    }

    @Test
    void aRangeThatContainsOneIsWithinNoise() {
        LevelReport l = ReportRunner.summarise(Level.NONE, List.of(run(1000, 500), run(1000, 500)), new double[] {0.99, 1.01}, null,
                new Spread(20, 10, 30), null);
        assertTrue(l.withinNoise());
        assertEquals(1.0, l.ratioToStock().median(), 1e-12);
        assertEquals(0.01, l.ratioToStock().halfRangeFraction(), 1e-12);
        assertEquals(null, l.protectionGBps(), "none protects nothing");
    }
}
