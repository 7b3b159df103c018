package dev.kvshield.perf.report;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.perf.simulate.LeakSample;
import dev.kvshield.perf.simulate.SimulationResult;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Builds the {@code report.json} tree; the schema is documented in {@code perf/REPORT-SCHEMA.md}. */
public final class ReportJson {
    /** Bumped whenever a field changes meaning or is removed. */
    public static final int SCHEMA_VERSION = 2;
    /** How the spread of every ratio is computed, as the report states it. */
    public static final String SPREAD_RULE = "[min, max] of the per-pair ratios (every timed pair lies inside);"
            + " ±x% is (max - min) / 2 / median";

    private ReportJson() {}

    public static Map<String, Object> tree(ReportData d) {
        Map<String, Object> root = new LinkedHashMap<>();
        root.put("schemaVersion", SCHEMA_VERSION);
        root.put("generatedAt", Instant.now().toString());
        root.put("machine", d.machine().toJson());
        root.put("jdk", d.machine().jdk());
        Map<String, Object> backend = new LinkedHashMap<>();
        backend.put("name", d.backend());
        backend.put("memory", d.memoryDescription());
        root.put("backend", backend);
        root.put("geometry", geometry(d.config().geometry(), d.config().geometryNote()));
        Map<String, Object> trace = new LinkedHashMap<>(d.config().traceParameters());
        trace.put("source", d.config().trace().source());
        trace.put("requests", d.config().trace().requests().size());
        trace.put("tenants", d.config().trace().tenants());
        trace.put("totalTokens", d.config().trace().totalTokens());
        root.put("trace", trace);
        root.put("seed", d.config().seed());
        root.put("method", method(d));
        Map<String, Object> limits = new LinkedHashMap<>();
        limits.put("memsetGBps", spread(d.fillGBps()));
        limits.put("chacha20GBps", d.chacha20GBps() == null ? null : spread(d.chacha20GBps()));
        root.put("limits", limits);
        List<Object> levels = new ArrayList<>();
        for (LevelReport l : d.levels()) {
            levels.add(level(l, d.config().modelStepMillis()));
        }
        root.put("levels", levels);
        List<Object> incidents = new ArrayList<>();
        for (dev.kvshield.perf.replay.IncidentResult r : d.incidents()) {
            incidents.add(r.toJson());
        }
        root.put("incidents", incidents);
        root.put("jmh", new ArrayList<Object>(d.jmh()));
        List<Object> skipped = new ArrayList<>();
        d.skipped().forEach((what, why) -> {
            Map<String, Object> s = new LinkedHashMap<>();
            s.put("what", what);
            s.put("reason", why);
            skipped.add(s);
        });
        root.put("skipped", skipped);
        return root;
    }

    static Map<String, Object> geometry(PoolGeometry g, String note) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("note", note);
        m.put("layers", g.layers());
        m.put("buffersPerLayer", g.buffersPerLayer());
        m.put("bufferKinds", g.kinds().stream().map(Enum::name).toList());
        m.put("bytesPerTokenPerBuffer", g.bytesPerToken(0));
        m.put("pageSizeTokens", g.pageSizeTokens());
        m.put("pageCount", g.pageCount());
        m.put("pageBytesAllBuffers", g.pageBytesAllBuffers());
        m.put("poolBytes", g.pageBytesAllBuffers() * g.pageCount());
        m.put("capacityTokens", g.capacityTokens());
        return m;
    }

    static Map<String, Object> spread(Spread s) {
        if (s == null) {
            return null;
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("median", s.median());
        m.put("min", s.min());
        m.put("max", s.max());
        return m;
    }

    static Map<String, Object> method(ReportData d) {
        ReportData.Method x = d.method();
        Map<String, Object> method = new LinkedHashMap<>();
        method.put("rounds", d.config().rounds());
        method.put("pairing", pairing(d.config().turnSteps()));
        method.put("warmupRounds", x.warmupRounds());
        method.put("warmupMinRounds", d.config().warmupRounds());
        method.put("warmupMaxRounds", d.config().maxWarmupRounds());
        method.put("warmupJitQuiet", x.warmupQuiet());
        method.put("warmupLastCompileShare", x.lastWarmupCompileShare());
        method.put("oracleRoundsSeparate", true);
        method.put("statistic", "median over timed pairs (ratios) or timed runs (everything else)");
        method.put("spread", SPREAD_RULE);
        method.put("withinNoiseRule", "the per-pair ratios' [min, max] range contains 1.0");
        method.put("allocatorTiming", x.allocatorTiming());
        method.put("modelStepMs", d.config().modelStepMillis());
        method.put("timedSeconds", x.timedSeconds());
        method.put("timedCompileMs", x.timed().compileMillis() < 0 ? null : x.timed().compileMillis());
        method.put("timedGcCount", x.timed().gcCount());
        method.put("timedGcMs", x.timed().gcMillis());
        method.put("loadAverageBefore", x.loadBefore() < 0 ? null : x.loadBefore());
        method.put("loadAverageAfter", x.loadAfter() < 0 ? null : x.loadAfter());
        method.put("elapsedSeconds", d.elapsedSeconds());
        return method;
    }

    /** The pairing as the report states it. */
    static String pairing(int turnSteps) {
        String turns = turnSteps == Pairing.LOCKSTEP ? "in lockstep (one scheduler step per turn)"
                : turnSteps == Pairing.BACK_TO_BACK ? "back to back" : "in turns of " + turnSteps + " scheduler steps";
        return "each round pairs every level (stock too) with its own stock runs on the same trace: two legs, each side on"
                + " its own memory region, run " + turns + ", turns ordered A B B A; the second leg swaps the regions and who"
                + " goes first; ratio = the level's tokens/s ÷ stock's, each over both legs (a region's speed cancels)";
    }

    static Map<String, Object> level(LevelReport l, double modelStepMillis) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("level", l.level().label());
        m.put("status", l.measured() ? "measured" : "skipped");
        if (!l.measured()) {
            m.put("skipReason", l.skipReason());
            return m;
        }
        m.put("tokensPerSecond", spread(l.tokensPerSecond()));
        m.put("ratioToStock", spread(l.ratioToStock()));
        m.put("ratioSpreadPercent", 100 * l.ratioToStock().halfRangeFraction());
        List<Object> pairs = new ArrayList<>();
        for (double r : l.ratioPairs()) {
            pairs.add(r);
        }
        m.put("ratioPairs", pairs);
        m.put("withinNoise", l.withinNoise());
        Map<String, Object> latency = new LinkedHashMap<>();
        latency.put("p50", spread(l.stepP50Millis()));
        latency.put("p99", spread(l.stepP99Millis()));
        m.put("stepLatencyMs", latency);
        AllocatorCost a = l.allocator();
        Map<String, Object> allocator = new LinkedHashMap<>();
        allocator.put("p50", spread(a.p50Micros()));
        allocator.put("p99", spread(a.p99Micros()));
        allocator.put("mean", spread(a.meanMicros()));
        allocator.put("protectionShare", a.protectionShare());
        m.put("allocatorMicrosPerStep", allocator);
        AllocatorCost.Share share = a.shareOfModelStep(modelStepMillis);
        Map<String, Object> shares = new LinkedHashMap<>();
        shares.put("p50", share.p50());
        shares.put("p99", share.p99());
        shares.put("mean", share.mean());
        m.put("modelStepShare", shares);
        m.put("bytesProtectedPerSecond", l.bytesProtectedPerSecond());
        Map<String, Object> protection = new LinkedHashMap<>();
        protection.put("GBps", l.protectionGBps());
        protection.put("limit", l.limitName());
        protection.put("limitGBps", l.limitGBps());
        protection.put("fractionOfLimit", l.protectionGBps() == null || l.limitGBps() == null ? null : l.protectionGBps() / l.limitGBps());
        m.put("protectionBandwidth", protection);
        SimulationResult o = l.oracle();
        m.put("pagesReused", o.pagesReused());
        m.put("pagesHandedOut", o.pagesHandedOut());
        m.put("prefixReclaims", o.prefixReclaims());
        m.put("prefixRecomputes", o.prefixRecomputes());
        m.put("leaks", o.leakedRequests());
        m.put("leakedBytes", o.leakedBytes());
        m.put("leakFlows", new LinkedHashMap<>(o.leakFlows()));
        LeakSample first = o.firstLeak();
        m.put("firstLeak", first == null ? null : first.describe());
        m.put("residuePages", o.dirtyHandOuts());
        m.put("foreignResiduePages", o.foreignResidueHandOuts());
        m.put("plaintextSealedPages", o.plaintextSealedPages());
        Map<String, Object> counts = new LinkedHashMap<>();
        counts.put("completed", o.completed());
        counts.put("aborted", o.aborted());
        counts.put("rejected", o.rejected());
        counts.put("failed", o.failed());
        counts.put("handoffs", o.handoffs());
        counts.put("steps", o.steps());
        counts.put("tokens", o.tokens());
        m.put("requests", counts);
        return m;
    }
}
