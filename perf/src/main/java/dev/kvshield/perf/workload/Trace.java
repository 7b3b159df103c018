package dev.kvshield.perf.workload;

import java.util.List;

/**
 * A trace: requests in arrival order, the number of tenants they use, and where the trace came from
 * (for the report).
 */
public record Trace(List<TraceRequest> requests, int tenants, String source) {
    public Trace {
        requests = List.copyOf(requests);
        int previous = 0;
        for (TraceRequest r : requests) {
            if (r.tenant() >= tenants) {
                throw new IllegalArgumentException("request " + r.id() + " has tenant " + r.tenant() + " but the trace has " + tenants
                        + " tenants");
            }
            if (r.arrivalStep() < previous) {
                throw new IllegalArgumentException("requests must be in arrival order: request " + r.id() + " arrives at step "
                        + r.arrivalStep() + " after a request at step " + previous);
            }
            previous = r.arrivalStep();
        }
    }

    /** Prompt plus output tokens over every request (what the trace asks the engine to process). */
    public long totalTokens() {
        long n = 0;
        for (TraceRequest r : requests) {
            n += r.promptTokens() + r.outputTokens();
        }
        return n;
    }
}
