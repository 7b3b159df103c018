package dev.kvshield.perf.report;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.perf.replay.Incident;
import dev.kvshield.perf.replay.IncidentResult;
import dev.kvshield.perf.replay.Incidents;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.perf.simulate.Backends;
import dev.kvshield.perf.simulate.Handoff;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.PoolFactory;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.perf.simulate.ServingPool;
import dev.kvshield.perf.simulate.SimulationOptions;
import dev.kvshield.perf.simulate.SimulationResult;
import dev.kvshield.perf.simulate.Simulator;
import dev.kvshield.protection.PageSealerFactory;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Runs a report: every available level and {@code stock} on the same memory and trace, in
 * interleaved timed rounds (round {@code r} starts at a different level, so no level always runs
 * first), the same run's bandwidth limits between rounds, then one oracle round per level (the
 * byte oracles never run in timed rounds), then every named incident replayed under every level.
 */
public final class ReportRunner {
    private final ReportConfig config;
    private final PrintStream progressOut;
    private final Availability<PageSealerFactory> sealer;
    private final Availability<Sealers.RawCipher> chacha20;

    /**
     * @param progressOut where the progress line goes (null: silent)
     * @param sealer the ENCRYPT key source, or why there is none
     * @param chacha20 the raw cipher the seal is compared with, or why there is none
     */
    public ReportRunner(ReportConfig config, PrintStream progressOut, Availability<PageSealerFactory> sealer,
            Availability<Sealers.RawCipher> chacha20) {
        this.config = config;
        this.progressOut = progressOut;
        this.sealer = sealer;
        this.chacha20 = chacha20;
    }

    /** A runner with the key source and cipher found on the class path. */
    public static ReportRunner withClassPath(ReportConfig config, PrintStream progressOut) {
        return new ReportRunner(config, progressOut, Sealers.hostSealer(), Availability.of(Sealers.rawChaCha20()));
    }

    public ReportData run() {
        Map<String, String> skipped = new LinkedHashMap<>();
        String backend = config.backend();
        Availability<PageMemory> memory = Backends.allocate(backend, config.geometry());
        if (!memory.available()) {
            skipped.put("backend " + backend, memory.reason() + "; the report ran on the cpu backend instead");
            backend = "cpu";
            memory = Backends.allocate(backend, config.geometry());
        }
        try (PageMemory mem = memory.value(); PageMemory prefillMem = Backends.allocate(backend, config.geometry()).value()) {
            PageSealerFactory sealerFactory = sealer.value();
            if (sealerFactory != null && !mem.isHostAccessible()) {
                // Device memory: the same keys and keystream, sealed by cuda-scrub's kernel.
                Availability<PageSealerFactory> gpu = Sealers.cudaSealer();
                if (!gpu.available()) {
                    skipped.put("level encrypt", gpu.reason());
                }
                sealerFactory = gpu.value();
            }
            PoolFactory factory = PoolFactory.synchronous(sealerFactory);
            List<Level> levels = new ArrayList<>();
            levels.add(Level.STOCK);
            Map<Level, String> skipReasons = new EnumMap<>(Level.class);
            for (Level l : config.levels()) {
                if (l == Level.STOCK || levels.contains(l)) {
                    continue;
                }
                if (factory.supports(l)) {
                    levels.add(l);
                } else {
                    String reason = skipped.getOrDefault("level encrypt", "no key source: " + sealer.reason());
                    skipReasons.put(l, reason);
                    skipped.put("level " + l.label(), reason);
                }
            }
            return measure(mem, prefillMem, backend, factory, levels, skipReasons, skipped);
        }
    }

    private ReportData measure(PageMemory mem, PageMemory prefillMem, String backend, PoolFactory factory, List<Level> levels, Map<Level, String> skipReasons,
            Map<String, String> skipped) {
        int n = levels.size();
        int rounds = config.rounds();
        double oracleWeight = 3;
        Progress progress = new Progress(progressOut, n * (config.warmupRounds() + rounds + oracleWeight));
        Map<Level, List<SimulationResult>> timed = new EnumMap<>(Level.class);
        Map<Level, SimulationResult> oracle = new EnumMap<>(Level.class);
        List<IncidentResult> incidents = new ArrayList<>();
        double[] fill = new double[rounds];
        double[] cipher = new double[rounds];
        try (Limits limits = new Limits(config.fillBytes(), chacha20.value())) {
            for (int w = 0; w < config.warmupRounds(); w++) {
                for (Level l : levels) {
                    progress.show("warm-up " + (w + 1) + "/" + config.warmupRounds() + ": " + l.label());
                    runOnce(factory, l, mem, prefillMem, false);
                    progress.done(1);
                }
            }
            for (int r = 0; r < rounds; r++) {
                for (int i = 0; i < n; i++) {
                    Level l = levels.get((i + r) % n);
                    progress.show("round " + (r + 1) + "/" + rounds + ": " + l.label());
                    timed.computeIfAbsent(l, k -> new ArrayList<>()).add(runOnce(factory, l, mem, prefillMem, false));
                    progress.done(1);
                }
                fill[r] = limits.fillGBps(3);
                cipher[r] = limits.hasChaCha20() ? limits.chacha20GBps(3) : Double.NaN;
            }
            for (Level l : levels) {
                progress.show("oracle round: " + l.label());
                oracle.put(l, runOnce(factory, l, mem, prefillMem, true));
                progress.done(oracleWeight);
            }
            progress.show("incident replays");
            for (Incident incident : Incidents.all()) {
                for (Level l : levels) {
                    incidents.add(incident.replay(l, factory.sealer()));
                }
            }
        }
        Spread fillSpread = Spread.of(fill);
        Spread cipherSpread = chacha20.available() ? Spread.of(cipher) : null;
        if (!chacha20.available()) {
            skipped.put("limit chacha20", chacha20.reason());
        }
        List<LevelReport> reports = new ArrayList<>();
        for (Level l : Level.values()) {
            if (skipReasons.containsKey(l)) {
                reports.add(LevelReport.skipped(l, skipReasons.get(l)));
            } else if (timed.containsKey(l)) {
                reports.add(summarise(l, timed.get(l), timed.get(Level.STOCK), oracle.get(l), fillSpread, cipherSpread));
            }
        }
        progress.finish("kvshield report: measured " + levels.size() + " levels x " + rounds + " rounds in "
                + Math.round(progress.elapsedSeconds()) + " s");
        return new ReportData(MachineInfo.current(), config, backend, mem.describe(), reports, fillSpread, cipherSpread, skipped,
                progress.elapsedSeconds(), incidents,
                config.jmhResults() == null ? List.of() : JmhResults.read(config.jmhResults()));
    }

    private SimulationResult runOnce(PoolFactory factory, Level level, PageMemory mem, PageMemory prefillMem, boolean oracles) {
        SimulationOptions o = config.simulation();
        SimulationOptions options = new SimulationOptions(o.maxRunning(), o.prefillTokensPerStep(), o.residentPrefixes(), oracles);
        try (ServingPool pool = factory.create(level, mem); ServingPool prefill = factory.create(level, prefillMem);
                Handoff handoff = Handoff.of(prefill, pool)) {
            return new Simulator(pool, handoff, config.trace(), options).run();
        }
    }

    static LevelReport summarise(Level level, List<SimulationResult> runs, List<SimulationResult> stock, SimulationResult oracle,
            Spread fill, Spread cipher) {
        int n = runs.size();
        double[] tps = new double[n];
        double[] ratio = new double[n];
        double[] p50 = new double[n];
        double[] p99 = new double[n];
        double[] protectedPerSecond = new double[n];
        double[] protectionGBps = new double[n];
        for (int i = 0; i < n; i++) {
            SimulationResult r = runs.get(i);
            tps[i] = r.tokensPerSecond();
            ratio[i] = tps[i] / stock.get(i).tokensPerSecond();
            p50[i] = Spread.quantile(r.stepNanos(), 0.50) / 1e6;
            p99[i] = Spread.quantile(r.stepNanos(), 0.99) / 1e6;
            protectedPerSecond[i] = r.bytesProtected() / (r.wallNanos() / 1e9);
            protectionGBps[i] = r.protectionSeconds() > 0 ? r.bytesProtected() / r.protectionSeconds() / 1e9 : Double.NaN;
        }
        Spread ratioSpread = Spread.of(ratio);
        boolean protects = level != Level.STOCK && level != Level.NONE;
        String limitName = !protects ? null : level == Level.ENCRYPT ? "chacha20" : "memset";
        Spread limit = !protects ? null : level == Level.ENCRYPT ? cipher : fill;
        return new LevelReport(level, null, Spread.of(tps), ratioSpread, level == Level.STOCK || ratioSpread.covers(1.0),
                Spread.of(p50), Spread.of(p99), Spread.of(protectedPerSecond).median(),
                protects ? Spread.of(protectionGBps).median() : null, limit == null ? null : limitName,
                limit == null ? null : limit.median(), oracle);
    }
}
