package dev.kvshield.perf.workload;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

/** Generates multi-tenant traces from a {@link TraceSpec}; the same spec always gives the same trace. */
public final class SyntheticTraces {
    private SyntheticTraces() {}

    /**
     * Draws a trace: Poisson arrivals, tenants uniformly, prompt and output lengths from the spec's
     * distributions; a request with a prefix starts with its tenant's shared prefix, rounded down to
     * whole pages of {@code pageSizeTokens}; an aborting request stops after a uniform share of its
     * output.
     */
    public static Trace generate(TraceSpec spec, int pageSizeTokens) {
        SplittableRandom random = new SplittableRandom(spec.seed());
        int prefix = spec.prefixTokens() / pageSizeTokens * pageSizeTokens;
        List<TraceRequest> out = new ArrayList<>(spec.requests());
        double clock = 0;
        for (int id = 0; id < spec.requests(); id++) {
            clock += -Math.log(1.0 - random.nextDouble()) / spec.arrivalsPerStep();
            int tenant = random.nextInt(spec.tenants());
            boolean withPrefix = prefix > 0 && random.nextDouble() < spec.prefixFraction();
            int promptFloor = withPrefix ? prefix + 1 : 1;
            int prompt = Math.max(promptFloor, spec.prompt().draw(random, spec.maxPromptTokens()));
            int output = spec.output().draw(random, 1 << 20);
            int abortAfter = random.nextDouble() < spec.abortFraction() && output > 1 ? random.nextInt(output) : -1;
            boolean handoff = random.nextDouble() < spec.handoffFraction();
            out.add(new TraceRequest(id, tenant, (int) clock, prompt, output, withPrefix ? prefix : 0, abortAfter, handoff));
        }
        return new Trace(out, spec.tenants(), "synthetic seed=" + spec.seed());
    }
}
