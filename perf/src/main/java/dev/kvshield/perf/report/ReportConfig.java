package dev.kvshield.perf.report;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.SimulationOptions;
import dev.kvshield.perf.workload.Trace;
import java.nio.file.Path;
import java.util.List;

/**
 * What one report run measures.
 *
 * @param geometryNote how the geometry was chosen (preset, scaled layers), for the report
 * @param traceParameters the trace's parameters as name/value pairs, for the report
 * @param levels the levels asked for ({@code stock} always runs: it is the yardstick)
 * @param rounds timed rounds per level, interleaved
 * @param warmupRounds untimed rounds per level before the timed ones (JIT warm-up)
 * @param fillBytes bytes of the contiguous region the memset limit is measured on
 * @param jmhResults a JMH JSON result file to fold in, or null
 */
public record ReportConfig(PoolGeometry geometry, String geometryNote, Trace trace, java.util.Map<String, Object> traceParameters,
        long seed, List<Level> levels, String backend, int rounds, int warmupRounds, SimulationOptions simulation,
        long fillBytes, Path outDir, Path jmhResults) {
    public ReportConfig {
        if (rounds < 1 || warmupRounds < 0) {
            throw new IllegalArgumentException("rounds must be >= 1 and warmupRounds >= 0: rounds=" + rounds + " warmupRounds="
                    + warmupRounds);
        }
        levels = List.copyOf(levels);
    }
}
