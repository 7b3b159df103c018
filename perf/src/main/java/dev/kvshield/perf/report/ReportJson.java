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
    public static final int SCHEMA_VERSION = 1;

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
        Map<String, Object> method = new LinkedHashMap<>();
        method.put("rounds", d.config().rounds());
        method.put("warmupRounds", d.config().warmupRounds());
        method.put("interleaved", true);
        method.put("oracleRoundsSeparate", true);
        method.put("statistic", "median over rounds with [min, max]");
        method.put("withinNoiseRule", "the per-round ratio to stock has a [min, max] range that contains 1.0");
        method.put("elapsedSeconds", d.elapsedSeconds());
        root.put("method", method);
        Map<String, Object> limits = new LinkedHashMap<>();
        limits.put("memsetGBps", spread(d.fillGBps()));
        limits.put("chacha20GBps", d.chacha20GBps() == null ? null : spread(d.chacha20GBps()));
        root.put("limits", limits);
        List<Object> levels = new ArrayList<>();
        for (LevelReport l : d.levels()) {
            levels.add(level(l));
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

    static Map<String, Object> level(LevelReport l) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("level", l.level().label());
        m.put("status", l.measured() ? "measured" : "skipped");
        if (!l.measured()) {
            m.put("skipReason", l.skipReason());
            return m;
        }
        m.put("tokensPerSecond", spread(l.tokensPerSecond()));
        m.put("ratioToStock", spread(l.ratioToStock()));
        m.put("withinNoise", l.withinNoise());
        Map<String, Object> latency = new LinkedHashMap<>();
        latency.put("p50", spread(l.stepP50Millis()));
        latency.put("p99", spread(l.stepP99Millis()));
        m.put("stepLatencyMs", latency);
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
