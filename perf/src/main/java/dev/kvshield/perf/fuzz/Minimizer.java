package dev.kvshield.perf.fuzz;

import java.util.ArrayList;
import java.util.List;

/**
 * Shrinks a trace that shows a finding while it still shows a finding of the same kind: first
 * whole requests (with their events), then chunks of events, halving the chunk down to single
 * events (delta debugging). Deterministic; bounded by {@code maxChecks}.
 */
public record Minimizer(Fuzzer fuzzer, int maxChecks) {
    public FuzzTrace minimize(FuzzTrace trace, Finding.Kind kind) {
        int[] budget = {maxChecks};
        FuzzTrace best = trace;
        for (FuzzTrace.RequestSpec r : trace.requests()) {
            int id = r.id();
            FuzzTrace candidate = best.onlyRequests(x -> x != id);
            if (reproduces(candidate, kind, budget)) {
                best = candidate;
            }
        }
        for (int chunk = Math.max(1, best.events().size() / 2); chunk >= 1; chunk /= 2) {
            int i = 0;
            while (i < best.events().size()) {
                List<FuzzTrace.Event> events = new ArrayList<>(best.events());
                events.subList(i, Math.min(events.size(), i + chunk)).clear();
                FuzzTrace candidate = best.withEvents(events);
                if (reproduces(candidate, kind, budget)) {
                    best = candidate;
                } else {
                    i += chunk;
                }
            }
        }
        return best;
    }

    private boolean reproduces(FuzzTrace candidate, Finding.Kind kind, int[] budget) {
        if (budget[0] <= 0) {
            return false;
        }
        budget[0]--;
        return fuzzer.check(candidate).has(kind);
    }
}
