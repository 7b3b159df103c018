package dev.kvshield.perf.report;

import java.util.List;
import java.util.Map;

/**
 * Everything a report run measured, before it is written out.
 *
 * @param backend the backend the figures came from
 * @param skipped what was not covered (a level, a backend, a limit) and why
 * @param incidents every named incident replayed under every measured level
 * @param jmh JMH results folded in from {@link ReportConfig#jmhResults()} (empty without)
 */
public record ReportData(MachineInfo machine, ReportConfig config, String backend, String memoryDescription, List<LevelReport> levels,
        Spread fillGBps, Spread chacha20GBps, Map<String, String> skipped, double elapsedSeconds,
        List<dev.kvshield.perf.replay.IncidentResult> incidents, List<Map<String, Object>> jmh) {
    public ReportData {
        levels = List.copyOf(levels);
        incidents = List.copyOf(incidents);
        jmh = List.copyOf(jmh);
        skipped = java.util.Collections.unmodifiableMap(new java.util.LinkedHashMap<>(skipped));
    }
}
