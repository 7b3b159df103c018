package dev.kvshield.perf.report;

import java.util.List;
import java.util.Map;

/**
 * Everything a report run measured, before it is written out.
 *
 * @param backend the backend the figures came from
 * @param skipped what was not covered (a level, a backend, a limit) and why
 * @param method how the figures were taken beyond the configuration: warm-up, the JVM's activity
 *     during the timed rounds, the machine's load
 * @param incidents every named incident replayed under every measured level
 * @param jmh JMH results folded in from {@link ReportConfig#jmhResults()} (empty without)
 */
public record ReportData(MachineInfo machine, ReportConfig config, String backend, String memoryDescription, List<LevelReport> levels,
        Spread fillGBps, Spread chacha20GBps, Map<String, String> skipped, double elapsedSeconds, Method method,
        List<dev.kvshield.perf.replay.IncidentResult> incidents, List<Map<String, Object>> jmh) {
    public ReportData {
        levels = List.copyOf(levels);
        incidents = List.copyOf(incidents);
        jmh = List.copyOf(jmh);
        skipped = java.util.Collections.unmodifiableMap(new java.util.LinkedHashMap<>(skipped));
    }

    /**
     * @param warmupRounds warm-up passes run
     * @param warmupQuiet true if warm-up ended because a pass compiled for at most {@link
     *     ReportRunner#JIT_QUIET_SHARE} of its time; false if it stopped at the most passes allowed
     *     (or the JVM does not report compilation time)
     * @param lastWarmupCompileShare JIT time ÷ wall time of the last warm-up pass (-1: no warm-up or
     *     not monitored)
     * @param timed what the JVM did during the timed rounds
     * @param timedSeconds wall time of the timed rounds
     * @param loadBefore the 1-minute load average when the report started (-1: unknown)
     * @param loadAfter the same after the timed rounds
     * @param allocatorTiming what timed the allocator's calls
     */
    public record Method(int warmupRounds, boolean warmupQuiet, double lastWarmupCompileShare, JvmActivity timed, double timedSeconds,
            double loadBefore, double loadAfter, String allocatorTiming) {}
}
