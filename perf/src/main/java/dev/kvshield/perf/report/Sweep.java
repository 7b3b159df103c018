package dev.kvshield.perf.report;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Handoff;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.PoolFactory;
import dev.kvshield.perf.simulate.ServingPool;
import dev.kvshield.perf.simulate.SimulationOptions;
import dev.kvshield.perf.simulate.Simulator;
import dev.kvshield.perf.workload.SyntheticTraces;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.perf.workload.TraceSpec;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.quarantine.QuarantineMode;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * {@code report --sweep}: runs every level over a grid of page size, synchronous or asynchronous
 * protection, and release lag (how many steps a release batch's protection may take before the step
 * boundary waits for it; the pool protects each release call as one batch), each setting against
 * stock at the same page size in the same round, and recommends per level the setting with the best
 * median throughput ratio, saying when the difference to the default setting is within noise.
 */
public final class Sweep {
    /** One point of the grid. */
    public record Setting(int pageSizeTokens, QuarantineMode mode, int releaseLagSteps) {
        public String label() {
            return pageSizeTokens + "-token pages, " + (mode == QuarantineMode.SYNCHRONOUS ? "sync" : "async") + ", lag "
                    + releaseLagSteps;
        }
    }

    /** Per level and setting, the per-round throughput ratio to stock. */
    public record Result(Setting base, Map<Level, Map<Setting, Spread>> ratios, Map<Level, Setting> recommended,
            Map<Level, Boolean> withinNoise) {}

    private Sweep() {}

    public static List<Setting> grid(int basePageSize) {
        List<Setting> grid = new ArrayList<>();
        for (int page : new int[] {basePageSize / 2, basePageSize, basePageSize * 2}) {
            grid.add(new Setting(page, QuarantineMode.SYNCHRONOUS, 0));
            grid.add(new Setting(page, QuarantineMode.ASYNCHRONOUS, 0));
            grid.add(new Setting(page, QuarantineMode.ASYNCHRONOUS, 2));
        }
        return grid;
    }

    /**
     * @param geometryAt the geometry for a page size (same bytes of KV)
     * @param spec the trace parameters (prefixes are rounded to each page size)
     */
    public static Result run(java.util.function.IntFunction<PoolGeometry> geometryAt, TraceSpec spec, List<Level> levels,
            PageSealerFactory sealer, SimulationOptions options, int rounds, int basePageSize, PrintStream progress) {
        List<Setting> grid = grid(basePageSize);
        Map<Level, Map<Setting, double[]>> raw = new LinkedHashMap<>();
        // One untimed pass over the grid first, so no setting pays for the JIT warming up.
        for (Setting s : grid) {
            PoolGeometry g = geometryAt.apply(s.pageSizeTokens());
            try (PageMemory decode = OffHeapPageMemory.allocate(g); PageMemory prefill = OffHeapPageMemory.allocate(g)) {
                for (Level l : levels) {
                    runOnce(new PoolFactory(sealer, s.mode(), s.releaseLagSteps()), l, decode, prefill,
                            SyntheticTraces.generate(spec, s.pageSizeTokens()), options);
                }
            }
        }
        int done = 0;
        int total = rounds * grid.size() * levels.size();
        for (int r = 0; r < rounds; r++) {
            for (Setting s : grid) {
                PoolGeometry g = geometryAt.apply(s.pageSizeTokens());
                Trace trace = SyntheticTraces.generate(spec, s.pageSizeTokens());
                PoolFactory factory = new PoolFactory(sealer, s.mode(), s.releaseLagSteps());
                try (PageMemory decode = OffHeapPageMemory.allocate(g); PageMemory prefill = OffHeapPageMemory.allocate(g)) {
                    double stock = 0;
                    for (int i = 0; i < levels.size(); i++) {
                        Level l = levels.get((i + r) % levels.size());
                        if (progress != null) {
                            progress.print("\rkvshield sweep: round " + (r + 1) + "/" + rounds + ", " + s.label() + ", " + l.label() + " ("
                                    + (++done) + "/" + total + ")        ");
                            progress.flush();
                        }
                        double tps = runOnce(factory, l, decode, prefill, trace, options);
                        if (l == Level.STOCK) {
                            stock = tps;
                        }
                        raw.computeIfAbsent(l, k -> new LinkedHashMap<>()).computeIfAbsent(s, k -> new double[rounds])[r] = tps;
                    }
                    for (Level l : levels) {
                        raw.get(l).get(s)[r] /= stock;
                    }
                }
            }
        }
        if (progress != null) {
            progress.println();
        }
        Map<Level, Map<Setting, Spread>> ratios = new LinkedHashMap<>();
        Map<Level, Setting> best = new LinkedHashMap<>();
        Map<Level, Boolean> noise = new LinkedHashMap<>();
        Setting base = new Setting(basePageSize, QuarantineMode.SYNCHRONOUS, 0);
        for (Map.Entry<Level, Map<Setting, double[]>> e : raw.entrySet()) {
            if (e.getKey() == Level.STOCK) {
                continue; // the yardstick: 1.0 everywhere by construction
            }
            Map<Setting, Spread> bySetting = new LinkedHashMap<>();
            e.getValue().forEach((s, v) -> bySetting.put(s, Spread.of(v)));
            ratios.put(e.getKey(), bySetting);
            Setting top = base;
            for (Map.Entry<Setting, Spread> c : bySetting.entrySet()) {
                if (c.getValue().median() > bySetting.get(top).median()) {
                    top = c.getKey();
                }
            }
            best.put(e.getKey(), top);
            // The recommendation beats the default only if their ranges do not overlap.
            noise.put(e.getKey(), bySetting.get(top).min() <= bySetting.get(base).max());
        }
        return new Result(base, ratios, best, noise);
    }

    private static double runOnce(PoolFactory factory, Level level, PageMemory decode, PageMemory prefill, Trace trace,
            SimulationOptions options) {
        try (ServingPool pool = factory.create(level, decode); ServingPool source = factory.create(level, prefill);
                Handoff handoff = Handoff.of(source, pool)) {
            return new Simulator(pool, handoff, trace, options).run().tokensPerSecond();
        }
    }

    /** The sweep as Markdown: ratios per level and setting, then the recommendations. */
    public static String markdown(Result r, MachineInfo machine) {
        StringBuilder sb = new StringBuilder("# kvshield tuning sweep\n\nThroughput relative to stock at the same page size, same round"
                + " (median [min, max]); measured on " + machine.label() + ".\n\n| level | setting | ratio to stock |\n| --- | --- | --- |\n");
        r.ratios().forEach((level, bySetting) -> bySetting.forEach((s, spread) -> sb.append("| ").append(level.label()).append(" | ")
                .append(s.label()).append(" | ").append(ReportWriter.spread(spread, 3)).append(" |\n")));
        sb.append("\n## Recommended settings\n\n");
        r.recommended().forEach((level, s) -> sb.append("- ").append(level.label()).append(": ").append(s.label())
                .append(r.withinNoise().get(level) ? " (within noise of the default, " + r.base().label() + ": keep the default)" : "")
                .append('\n'));
        return sb.toString();
    }

    public static Map<String, Object> toJson(Result r) {
        Map<String, Object> root = new LinkedHashMap<>();
        List<Object> rows = new ArrayList<>();
        r.ratios().forEach((level, bySetting) -> bySetting.forEach((s, spread) -> {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("level", level.label());
            m.put("pageSizeTokens", s.pageSizeTokens());
            m.put("quarantineMode", s.mode().name().toLowerCase(java.util.Locale.ROOT));
            m.put("releaseLagSteps", s.releaseLagSteps());
            m.put("ratioToStock", ReportJson.spread(spread));
            rows.add(m);
        }));
        root.put("settings", rows);
        Map<String, Object> rec = new LinkedHashMap<>();
        r.recommended().forEach((level, s) -> {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("setting", s.label());
            m.put("withinNoiseOfDefault", r.withinNoise().get(level));
            rec.put(level.label(), m);
        });
        root.put("recommended", rec);
        return root;
    }
}
