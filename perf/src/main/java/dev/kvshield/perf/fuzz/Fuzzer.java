package dev.kvshield.perf.fuzz;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;

/**
 * The differential check of one trace: run it, then run every request that read back alone (the
 * trace's own events for that request, plus every step boundary and protection turn) on a fresh
 * pool and compare the bytes; a difference is a {@link Finding.Kind#DIFF} finding.
 *
 * <p>Thread-safe if {@code rigs} is: each check builds its own pools.
 *
 * @param rigs a fresh rig per run (planted twins keep per-run state)
 */
public record Fuzzer(TraceRunner runner, Supplier<Rig> rigs) {
    /** What one check saw: the trace run's result, with DIFF findings added, and how many events ran in all. */
    public record Check(RunResult result, List<Finding> findings, long eventsRun) {
        public boolean clean() {
            return findings.isEmpty();
        }

        public boolean has(Finding.Kind kind) {
            return findings.stream().anyMatch(f -> f.kind() == kind);
        }
    }

    public Check check(FuzzTrace trace) {
        RunResult whole = runner.run(trace, rigs.get());
        List<Finding> findings = new ArrayList<>(whole.findings());
        long events = whole.events();
        for (Map.Entry<Integer, Long> e : whole.readBack().entrySet()) {
            int id = e.getKey();
            RunResult alone = runner.run(trace.onlyRequests(r -> r == id), rigs.get());
            events += alone.events();
            Long soloDigest = alone.readBack().get(id);
            if (soloDigest != null && !soloDigest.equals(e.getValue())) {
                findings.add(new Finding(Finding.Kind.DIFF, -1, id, "read back differs from the same request run alone"));
            }
        }
        return new Check(whole, List.copyOf(findings), events);
    }
}
