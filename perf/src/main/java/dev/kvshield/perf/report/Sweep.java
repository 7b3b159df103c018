package dev.kvshield.perf.report;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.PoolFactory;
import dev.kvshield.perf.simulate.SimulationOptions;
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
 * boundary waits for it; the pool protects each release call as one batch), each setting paired
 * with its own stock run at the same page size, and recommends per level the setting with the best
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

    /** Per level and setting, the per-pair throughput ratio to stock. */
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
     * Runs the grid: one untimed pass, then {@code rounds} rounds, each pairing every level with its
     * own stock run at every setting ({@link Pairing#runPair}, back to back: in lockstep an
     * asynchronous setting's protection worker would run during the paired stock steps).
     *
     * @param geometryAt the geometry for a page size (same bytes of KV)
     * @param spec the trace parameters (prefixes are rounded to each page size)
     * @param levels the levels to sweep (stock is the yardstick, not swept)
     */
    public static Result run(java.util.function.IntFunction<PoolGeometry> geometryAt, TraceSpec spec, List<Level> levels,
            PageSealerFactory sealer, SimulationOptions options, int rounds, int basePageSize, PrintStream progress) {
        List<Setting> grid = grid(basePageSize);
        List<Level> swept = levels.stream().filter(l -> l != Level.STOCK).toList();
        Map<Level, Map<Setting, double[]>> raw = new LinkedHashMap<>();
        int done = 0;
        int total = (rounds + 1) * grid.size() * swept.size();
        List<Pairing.Slot> schedule = Pairing.schedule(swept.size(), rounds + 1);
        for (Setting s : grid) {
            PoolGeometry g = geometryAt.apply(s.pageSizeTokens());
            Trace trace = SyntheticTraces.generate(spec, s.pageSizeTokens());
            PoolFactory factory = new PoolFactory(sealer, s.mode(), s.releaseLagSteps());
            PageMemory[] decode = new PageMemory[2];
            PageMemory[] prefill = new PageMemory[2];
            try {
                for (int i = 0; i < 2; i++) {
                    decode[i] = OffHeapPageMemory.allocate(g);
                    prefill[i] = OffHeapPageMemory.allocate(g);
                }
                // Round 0 is untimed, so no setting pays for the JIT warming up.
                for (Pairing.Slot slot : schedule) {
                    Level l = swept.get(slot.level());
                    if (progress != null) {
                        progress.print("\rkvshield sweep: " + (slot.round() == 0 ? "warm-up" : "round " + slot.round() + "/" + rounds) + ", "
                                + s.label() + ", " + l.label() + " (" + (++done) + "/" + total + ")        ");
                        progress.flush();
                    }
                    double ratio = Pairing.runPair(factory, l, trace, options, decode, prefill, slot.stockFirst(), Pairing.BACK_TO_BACK)
                            .ratio();
                    if (slot.round() > 0) {
                        raw.computeIfAbsent(l, k -> new LinkedHashMap<>()).computeIfAbsent(s, k -> new double[rounds])[slot.round() - 1] =
                                ratio;
                    }
                }
            } finally {
                for (int i = 0; i < 2; i++) {
                    closeIfOpen(decode[i]);
                    closeIfOpen(prefill[i]);
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

    private static void closeIfOpen(PageMemory memory) {
        if (memory != null) {
            memory.close();
        }
    }

    /** The sweep as Markdown: ratios per level and setting, then the recommendations. */
    public static String markdown(Result r, MachineInfo machine) {
        StringBuilder sb = new StringBuilder("# kvshield tuning sweep\n\nThroughput relative to a stock run at the same page size, paired"
                + " (median [min, max] over pairs, each pair run back to back); measured on " + machine.label() + ".\n\n| level | setting | ratio to stock |\n| --- | --- | --- |\n");
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
