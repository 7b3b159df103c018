package dev.kvshield.perf.report;

import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.SimulationResult;

/**
 * One level's figures in a report: from its timed runs (medians with their range) and its oracle
 * round; a skipped level carries only the reason.
 *
 * @param tokensPerSecond serving throughput over the level's timed runs
 * @param ratioToStock over the timed pairs, this level's throughput ÷ its paired stock run's (stock
 *     itself: exactly 1)
 * @param ratioPairs every pair's ratio, in run order (empty for stock)
 * @param withinNoise true when the ratio's range covers 1.0: the difference is not a cost
 * @param allocator the allocator's time per scheduler step
 * @param bytesProtectedPerSecond bytes the level protected per second of serving (median)
 * @param protectionGBps bytes protected per second spent protecting (median; null when the level
 *     protects nothing)
 * @param limitName the same run's limit the protection bandwidth is compared with ({@code memset}
 *     or {@code chacha20}), or null
 * @param limitGBps that limit (median), or null
 * @param oracle the oracle round's result (pages reused, reclaims, leaks, residue)
 */
public record LevelReport(Level level, String skipReason, Spread tokensPerSecond, Spread ratioToStock, double[] ratioPairs,
        boolean withinNoise, Spread stepP50Millis, Spread stepP99Millis, AllocatorCost allocator, double bytesProtectedPerSecond,
        Double protectionGBps, String limitName, Double limitGBps, SimulationResult oracle) {

    public static LevelReport skipped(Level level, String reason) {
        return new LevelReport(level, reason, null, null, null, false, null, null, null, 0, null, null, null, null);
    }

    public boolean measured() {
        return skipReason == null;
    }
}
