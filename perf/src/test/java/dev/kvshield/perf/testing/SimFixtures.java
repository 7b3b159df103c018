package dev.kvshield.perf.testing;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.perf.workload.LengthDistribution;
import dev.kvshield.perf.workload.SyntheticTraces;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.perf.workload.TraceSpec;

/** Tiny geometries and traces for fast simulation tests. */
public final class SimFixtures {
    public static final long SEED = 7;

    private SimFixtures() {}

    /** One layer of K and V, 16 bytes (one canary cell) per token, 4-token pages, {@code pages} pages. */
    public static PoolGeometry tinyGeometry(int pages) {
        return PoolGeometry.builder().mha(1, 1, 8, 2).pageSizeTokens(4).pageCount(pages).build();
    }

    /** 3 tenants, 30 requests, 8-token prefixes, aborts, handoffs, enough load to reuse pages and evict prefixes. */
    public static Trace tinyTrace(long seed) {
        TraceSpec spec = new TraceSpec(3, 30, 1.0, LengthDistribution.parse("uniform:4:24"), LengthDistribution.parse("uniform:2:12"), 8,
                0.7, 0.15, 0.3, 64, seed);
        return SyntheticTraces.generate(spec, 4);
    }
}
