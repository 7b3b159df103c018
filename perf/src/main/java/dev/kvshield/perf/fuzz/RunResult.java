package dev.kvshield.perf.fuzz;

import java.util.List;
import java.util.Map;

/**
 * What one run of a trace showed.
 *
 * @param readBack digest of every request's read-back bytes, for requests that read back
 * @param events events run (the end-of-trace drain not counted)
 * @param rejections guarded misuse the pool refused as it should (stale, fenced, foreign uses)
 * @param protectionErrors protection failures the pool threw (step boundaries or hand-outs)
 * @param protectionFailures pages whose protection failed or whose verification found a non-zero
 *     byte, as the pool's metrics count them
 * @param refusals hostile lease batches the pool refused as its contract says
 * @param exhaustions calls the pool refused because its lease ids or claim slots ran out, leaving it as it was
 */
public record RunResult(List<Finding> findings, Map<Integer, Long> readBack, int events, int rejections, int protectionErrors,
        long protectionFailures, int refusals, int exhaustions) {
    public boolean clean() {
        return findings.isEmpty();
    }
}
