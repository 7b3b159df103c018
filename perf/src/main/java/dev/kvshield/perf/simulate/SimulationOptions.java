package dev.kvshield.perf.simulate;

/**
 * Scheduler settings of one simulation run.
 *
 * @param maxRunning most requests decoding at once
 * @param prefillTokensPerStep most prompt tokens computed in one step (a longer prompt runs alone)
 * @param residentPrefixes tenant prefixes kept resident at once; the least recently used idle one
 *     is evicted to make room
 * @param oracles true to check every byte read (leak oracle) and every page handed out (residue
 *     oracle); timed rounds run without them
 */
public record SimulationOptions(int maxRunning, int prefillTokensPerStep, int residentPrefixes, boolean oracles) {
    public SimulationOptions {
        if (maxRunning < 1 || prefillTokensPerStep < 1 || residentPrefixes < 0) {
            throw new IllegalArgumentException("invalid simulation options: maxRunning=" + maxRunning + " prefillTokensPerStep="
                    + prefillTokensPerStep + " residentPrefixes=" + residentPrefixes + " (need >= 1, >= 1, >= 0)");
        }
    }
}
