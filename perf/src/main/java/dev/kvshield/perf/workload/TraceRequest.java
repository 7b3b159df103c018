package dev.kvshield.perf.workload;

/**
 * One request of a trace.
 *
 * @param id request id, unique in the trace, in {@code [0, 2^31)}
 * @param tenant tenant index in {@code [0, tenants)}
 * @param arrivalStep scheduler step at which the request arrives
 * @param promptTokens prompt length, the shared prefix included
 * @param outputTokens tokens to generate
 * @param prefixTokens leading prompt tokens that are the tenant's shared prefix (0: none)
 * @param abortAfterTokens output tokens after which the client aborts, or -1 (runs to completion)
 * @param handoff true if prefill runs on a prefill pool and the KV is handed off to a decode pool
 */
public record TraceRequest(int id, int tenant, int arrivalStep, int promptTokens, int outputTokens, int prefixTokens,
        int abortAfterTokens, boolean handoff) {
    public TraceRequest {
        if (id < 0 || tenant < 0 || arrivalStep < 0 || promptTokens < 1 || outputTokens < 1 || prefixTokens < 0
                || prefixTokens >= promptTokens || abortAfterTokens < -1 || abortAfterTokens >= outputTokens) {
            throw new IllegalArgumentException("invalid trace request: id=" + id + " tenant=" + tenant + " arrivalStep=" + arrivalStep
                    + " promptTokens=" + promptTokens + " outputTokens=" + outputTokens + " prefixTokens=" + prefixTokens
                    + " abortAfterTokens=" + abortAfterTokens + " (need id, tenant, arrivalStep >= 0; prompt, output >= 1;"
                    + " 0 <= prefix < prompt; -1 <= abortAfter < output)");
        }
    }

    public boolean aborts() {
        return abortAfterTokens >= 0;
    }
}
