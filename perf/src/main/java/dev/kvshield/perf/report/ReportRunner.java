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
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.protection.PageSealerFactory;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Runs a report: warm-up passes over every level until the JIT is quiet, the first of them the
 * oracle round (every level once with the byte oracles on; they never run in timed rounds), then
 * timed rounds that pair every level (stock too) with its own stock runs on the same trace ({@link
 * Pairing}), the same run's bandwidth limits after each round, then every named incident replayed
 * under every level. Without warm-up ({@code warmupRounds == 0}) the oracle round runs after the
 * timed rounds instead, so nothing warms the JIT before them.
 *
 * <p>Why the oracle round doubles as the first warm-up pass: it runs every level alone on the same
 * trace, which is what a warm-up pass is, and its results do not depend on timing; a separate round
 * cost the default report ~10 s of its ~2 minutes.
 *
 * <p>Memory: two regions of the configured geometry per side of a pair (decode and prefill pools),
 * four in all; the pools of every run are fresh, the regions are reused.
 */
public final class ReportRunner {
    /**
     * A warm-up pass whose JIT compilation time is at most this share of its wall time ends the
     * warm-up (once the fewest passes asked for have run).
     */
    public static final double JIT_QUIET_SHARE = 0.05;
    private static final double ORACLE_WEIGHT = 3;

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

    /** The two memory regions of each side of a pair: side 0 and side 1, decode and prefill. */
    private record Regions(PageMemory[] decode, PageMemory[] prefill) {}

    public ReportData run() {
        double loadBefore = JvmActivity.loadAverage();
        Map<String, String> skipped = new LinkedHashMap<>();
        String backend = config.backend();
        Availability<PageMemory> memory = Backends.allocate(backend, config.geometry());
        if (!memory.available()) {
            skipped.put("backend " + backend, memory.reason() + "; the report ran on the cpu backend instead");
            backend = "cpu";
            memory = Backends.allocate(backend, config.geometry());
        }
        try (PageMemory mem = memory.value(); PageMemory prefillMem = Backends.allocate(backend, config.geometry()).value();
                PageMemory otherMem = Backends.allocate(backend, config.geometry()).value();
                PageMemory otherPrefillMem = Backends.allocate(backend, config.geometry()).value()) {
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
            Regions regions = new Regions(new PageMemory[] {mem, otherMem}, new PageMemory[] {prefillMem, otherPrefillMem});
            return measure(regions, backend, factory, levels, skipReasons, skipped, loadBefore);
        }
    }

    private ReportData measure(Regions regions, String backend, PoolFactory factory, List<Level> levels, Map<Level, String> skipReasons,
            Map<String, String> skipped, double loadBefore) {
        int n = levels.size();
        int rounds = config.rounds();
        List<Pairing.Slot> schedule = Pairing.schedule(n, rounds);
        // NOTE: with warm-up, the oracle round is its first pass (weighed as an oracle round, not as a pass)
        Progress progress = new Progress(progressOut, n * (config.warmupRounds() - (config.warmupRounds() > 0 ? 1 : 0) + 4.0 * rounds + ORACLE_WEIGHT));
        Map<Level, List<SimulationResult>> timed = new EnumMap<>(Level.class);
        Map<Level, List<Double>> ratios = new EnumMap<>(Level.class);
        Map<Level, SimulationResult> oracle = new EnumMap<>(Level.class);
        List<IncidentResult> incidents = new ArrayList<>();
        double[] fill = new double[rounds];
        double[] cipher = new double[rounds];
        ReportData.Method method;
        try (Limits limits = new Limits(config.fillBytes(), chacha20.value())) {
            Warmup warmup = warmUp(factory, levels, regions, progress, oracle);
            JvmActivity before = JvmActivity.now();
            long timedStart = System.nanoTime();
            for (Pairing.Slot slot : schedule) {
                Level l = levels.get(slot.level());
                progress.show("round " + (slot.round() + 1) + "/" + rounds + ": " + l.label() + " vs stock");
                Pairing.Pair pair = Pairing.runPair(factory, l, config.trace(), options(false), regions.decode(), regions.prefill(),
                        slot.stockFirst(), config.turnSteps());
                timed.computeIfAbsent(l, k -> new ArrayList<>()).addAll(List.of(pair.level()));
                ratios.computeIfAbsent(l, k -> new ArrayList<>()).add(pair.ratio());
                progress.done(4);
                if (slot.level() == (slot.round() + n - 1) % n) { // the round's last pair
                    fill[slot.round()] = limits.fillGBps(3);
                    cipher[slot.round()] = limits.hasChaCha20() ? limits.chacha20GBps(3) : Double.NaN;
                }
            }
            double timedSeconds = (System.nanoTime() - timedStart) / 1e9;
            method = new ReportData.Method(warmup.passes(), warmup.quiet(), warmup.lastCompileShare(), JvmActivity.now().since(before),
                    timedSeconds, loadBefore, JvmActivity.loadAverage(), AllocatorCost.timingSource(regions.decode()[0]));
            if (oracle.isEmpty()) {
                for (Level l : levels) {
                    progress.show("oracle round: " + l.label());
                    oracle.put(l, runAlone(factory, l, regions, true));
                    progress.done(ORACLE_WEIGHT);
                }
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
                reports.add(summarise(l, timed.get(l), toArray(ratios.get(l)), oracle.get(l), fillSpread, cipherSpread));
            }
        }
        progress.finish("kvshield report: measured " + n + " levels x " + rounds + " paired rounds in "
                + Math.round(progress.elapsedSeconds()) + " s");
        return new ReportData(MachineInfo.current(), config, backend, regions.decode()[0].describe(), reports, fillSpread, cipherSpread,
                skipped, progress.elapsedSeconds(), method, incidents,
                config.jmhResults() == null ? List.of() : JmhResults.read(config.jmhResults()));
    }

    /** How the warm-up ended: passes run, whether the JIT was quiet, the last pass's compile share (-1: none). */
    private record Warmup(int passes, boolean quiet, double lastCompileShare) {}

    /**
     * Runs every level alone, pass after pass: at least {@link ReportConfig#warmupRounds()}, then on
     * until a pass compiled for at most {@link #JIT_QUIET_SHARE} of its time or {@link
     * ReportConfig#maxWarmupRounds()} passes ran (at the fewest when compilation is not monitored).
     * The first pass is the oracle round: its results go into {@code oracle}.
     */
    private Warmup warmUp(PoolFactory factory, List<Level> levels, Regions regions, Progress progress,
            Map<Level, SimulationResult> oracle) {
        int passes = 0;
        boolean quiet = false;
        double share = -1;
        while (passes < config.warmupRounds() || passes < config.maxWarmupRounds() && !quiet && share >= 0) {
            if (passes >= config.warmupRounds()) {
                progress.extend(levels.size());
            }
            JvmActivity before = JvmActivity.now();
            long start = System.nanoTime();
            boolean oracles = passes == 0;
            for (Level l : levels) {
                progress.show("warm-up " + (passes + 1) + (oracles ? " (oracle round): " : ": ") + l.label());
                SimulationResult result = runAlone(factory, l, regions, oracles);
                if (oracles) {
                    oracle.put(l, result);
                }
                progress.done(oracles ? ORACLE_WEIGHT : 1);
            }
            long compileMillis = JvmActivity.now().since(before).compileMillis();
            share = compileMillis < 0 ? -1 : compileMillis / ((System.nanoTime() - start) / 1e6);
            quiet = share >= 0 && share <= JIT_QUIET_SHARE;
            passes++;
        }
        return new Warmup(passes, quiet, share);
    }

    private SimulationOptions options(boolean oracles) {
        SimulationOptions o = config.simulation();
        return new SimulationOptions(o.maxRunning(), o.prefillTokensPerStep(), o.residentPrefixes(), oracles);
    }

    private SimulationResult runAlone(PoolFactory factory, Level level, Regions regions, boolean oracles) {
        try (ServingPool pool = factory.create(level, regions.decode()[0]); ServingPool prefill = factory.create(level, regions.prefill()[0]);
                Handoff handoff = Handoff.of(prefill, pool)) {
            return new Simulator(pool, handoff, config.trace(), options(oracles)).run();
        }
    }

    private static double[] toArray(List<Double> values) {
        double[] a = new double[values.size()];
        for (int i = 0; i < a.length; i++) {
            a[i] = values.get(i);
        }
        return a;
    }

    /**
     * One level's figures from its timed runs and the per-pair ratios to their yardstick runs.
     *
     * @param ratios per pair, the level's tokens/s ÷ its yardstick's, in run order
     */
    static LevelReport summarise(Level level, List<SimulationResult> runs, double[] ratios, SimulationResult oracle, Spread fill,
            Spread cipher) {
        int n = runs.size();
        double[] tps = new double[n];
        double[] p50 = new double[n];
        double[] p99 = new double[n];
        double[] protectedPerSecond = new double[n];
        double[] protectionGBps = new double[n];
        for (int i = 0; i < n; i++) {
            SimulationResult r = runs.get(i);
            tps[i] = r.tokensPerSecond();
            p50[i] = Spread.quantile(r.stepNanos(), 0.50) / 1e6;
            p99[i] = Spread.quantile(r.stepNanos(), 0.99) / 1e6;
            protectedPerSecond[i] = r.bytesProtected() / (r.wallNanos() / 1e9);
            protectionGBps[i] = r.protectionSeconds() > 0 ? r.bytesProtected() / r.protectionSeconds() / 1e9 : Double.NaN;
        }
        Spread ratioSpread = Spread.of(ratios);
        ProtectionLevel protection = level.protection();
        boolean protects = protection != null && (protection.scrubsOnRelease() || protection.needsKeySource());
        boolean seals = protects && protection.needsKeySource();
        String limitName = !protects ? null : seals ? "chacha20" : "memset";
        Spread limit = !protects ? null : seals ? cipher : fill;
        return new LevelReport(level, null, Spread.of(tps), ratioSpread, ratios.clone(), ratioSpread.covers(1.0), Spread.of(p50),
                Spread.of(p99), AllocatorCost.of(runs), Spread.of(protectedPerSecond).median(),
                protects ? Spread.of(protectionGBps).median() : null, limit == null ? null : limitName,
                limit == null ? null : limit.median(), oracle);
    }
}
