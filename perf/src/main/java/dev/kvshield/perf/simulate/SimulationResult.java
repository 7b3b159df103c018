package dev.kvshield.perf.simulate;

import java.util.Map;

/**
 * What one run of a trace through one pool produced.
 *
 * @param rejected requests that could never fit in the pool
 * @param failed requests whose handoff was refused
 * @param handoffs requests handed from the prefill pool to the decode pool
 * @param tokens prompt plus generated tokens of every request that was admitted (the same for
 *     every level on the same trace)
 * @param wallNanos serving time: the sum of {@code stepNanos} (pool creation and the final prefix
 *     release excluded)
 * @param stepNanos time of each scheduler step, in step order
 * @param allocatorStepNanos per step, the time spent inside the allocator's calls (allocate,
 *     release, reclaim, readers, step boundary, handoff control; KV reads and writes excluded), see
 *     {@link ServingPool#allocatorNanos()}
 * @param protectionStepNanos per step, the pools' own protection timing (scrub, seal, verify);
 *     inside {@code allocatorStepNanos} when protection runs synchronously
 * @param pagesHandedOut pages given out by allocation or reclaim, on the decode pool and (handoffs) the prefill pool
 * @param pagesReused of those, pages that had an owner before
 * @param prefixHits requests that found their tenant's prefix resident
 * @param prefixReclaims prefix pages reclaimed sealed (ENCRYPT) instead of recomputed
 * @param prefixRecomputes prefixes computed from scratch
 * @param bytesProtected bytes scrubbed, sealed or verified by the pool
 * @param protectionSeconds time the pool spent protecting them
 * @param leakedBytes bytes of another request's canary read (-1: oracles off)
 * @param leakedRequests requests that read a leaked byte (-1: oracles off)
 * @param leakFlows leaked bytes per "tenant A -> tenant B"
 * @param firstLeak the first leak seen, or null
 * @param dirtyHandOuts residue pages (-1: oracles off): pages handed out holding residue, plus
 *     {@code plaintextSealedPages}; the name predates the at-rest check
 * @param foreignResidueHandOuts pages handed out holding another tenant's data (-1: oracles off)
 * @param plaintextSealedPages pages whose seal completed with their tenant's plaintext still in
 *     them, both pools (-1: oracles off); counted in {@code dirtyHandOuts} too
 */
public record SimulationResult(Level level, int requests, int completed, int aborted, int rejected, int failed, long handoffs,
        long tokens, long steps,
        long wallNanos, long[] stepNanos, long[] allocatorStepNanos, long[] protectionStepNanos, long pagesHandedOut, long pagesReused, long prefixHits, long prefixReclaims,
        long prefixRecomputes, long bytesProtected, double protectionSeconds, long leakedBytes, int leakedRequests,
        Map<String, Long> leakFlows, LeakSample firstLeak, long dirtyHandOuts, long foreignResidueHandOuts,
        long plaintextSealedPages) {

    public double tokensPerSecond() {
        return tokens / (wallNanos / 1e9);
    }
}
