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
 * @param rounds timed rounds; each pairs every level with its own stock run (see {@link Pairing})
 * @param warmupRounds the fewest untimed passes over every level before the timed rounds (JIT
 *     warm-up); 0 runs none
 * @param maxWarmupRounds the most: passes go on past {@code warmupRounds} until the JIT is quiet
 *     (see {@link ReportRunner#JIT_QUIET_SHARE})
 * @param turnSteps scheduler steps each run of a pair takes per turn ({@link Pairing#LOCKSTEP} or
 *     {@link Pairing#BACK_TO_BACK})
 * @param modelStepMillis the model step the allocator's time per step is compared with
 * @param fillBytes bytes of the contiguous region the memset limit is measured on
 * @param jmhResults a JMH JSON result file to fold in, or null
 */
public record ReportConfig(PoolGeometry geometry, String geometryNote, Trace trace, java.util.Map<String, Object> traceParameters,
        long seed, List<Level> levels, String backend, int rounds, int warmupRounds, int maxWarmupRounds, int turnSteps,
        double modelStepMillis, SimulationOptions simulation, long fillBytes, Path outDir, Path jmhResults) {
    public ReportConfig {
        if (rounds < 1 || warmupRounds < 0 || maxWarmupRounds < warmupRounds || turnSteps < 1) {
            throw new IllegalArgumentException("need rounds >= 1, 0 <= warmupRounds <= maxWarmupRounds and turnSteps >= 1: rounds="
                    + rounds + " warmupRounds=" + warmupRounds + " maxWarmupRounds=" + maxWarmupRounds + " turnSteps=" + turnSteps);
        }
        if (!(modelStepMillis > 0) || Double.isInfinite(modelStepMillis)) {
            throw new IllegalArgumentException("the model step must be a positive number of milliseconds: " + modelStepMillis);
        }
        levels = List.copyOf(levels);
    }
}
