package dev.kvshield.perf.workload;

/**
 * Parameters of a synthetic multi-tenant trace (the defaults are in {@link dev.kvshield.perf.Defaults}).
 *
 * @param prefixTokens tokens of each tenant's shared prefix; rounded down to whole pages by the
 *     generator so prefix pages can be shared
 */
public record TraceSpec(int tenants, int requests, double arrivalsPerStep, LengthDistribution prompt, LengthDistribution output,
        int prefixTokens, double prefixFraction, double abortFraction, double handoffFraction, int maxPromptTokens, long seed) {
    public TraceSpec {
        if (tenants < 1 || requests < 1 || !(arrivalsPerStep > 0) || prefixTokens < 0 || maxPromptTokens < 2
                || !fraction(prefixFraction) || !fraction(abortFraction) || !fraction(handoffFraction)) {
            throw new IllegalArgumentException("invalid trace spec: tenants=" + tenants + " requests=" + requests + " arrivalsPerStep="
                    + arrivalsPerStep + " prefixTokens=" + prefixTokens + " maxPromptTokens=" + maxPromptTokens + " prefixFraction="
                    + prefixFraction + " abortFraction=" + abortFraction + " handoffFraction=" + handoffFraction
                    + " (counts >= 1, rate > 0, fractions in [0, 1])");
        }
        if (prompt == null || output == null) {
            throw new IllegalArgumentException("prompt and output distributions are required");
        }
    }

    private static boolean fraction(double f) {
        return f >= 0 && f <= 1;
    }
}
