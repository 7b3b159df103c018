package dev.kvshield.perf.cli;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.perf.Defaults;
import dev.kvshield.perf.report.Pairing;
import dev.kvshield.perf.report.ReportConfig;
import dev.kvshield.perf.report.ReportData;
import dev.kvshield.perf.report.ReportRunner;
import dev.kvshield.perf.report.ReportWriter;
import dev.kvshield.perf.simulate.Backends;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.SimulationOptions;
import dev.kvshield.perf.workload.LengthDistribution;
import dev.kvshield.perf.workload.SyntheticTraces;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.perf.workload.TraceCsv;
import dev.kvshield.perf.workload.TraceSpec;
import java.io.PrintStream;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * {@code report}: measures every protection level against {@code stock} and writes the report
 * files. {@code --quick} is a short run for development, {@code --full} a longer, steadier one. The
 * terminal gets the progress line and a summary table; library logging goes to {@code report.log}
 * in the output folder ({@code --verbose}: to the terminal too).
 */
final class ReportCommand {
    static final Set<String> OPTIONS = Set.of("out", "backend", "rounds", "warmup", "levels", "seed", "trace", "requests", "tenants",
            "arrivals", "prompt", "output", "prefix-tokens", "prefix-fraction", "abort-fraction", "handoff-fraction", "preset",
            "layers", "kv-heads", "head-dim", "latent-dim", "dtype", "page-size", "pool-pages", "max-running", "resident-prefixes", "jmh",
            "model-step-ms");
    static final Set<String> FLAGS = Set.of("full", "quick", "sweep", "verbose");
    /** Warm-up passes beyond the fewest asked for, while the JIT is still busy. */
    static final int EXTRA_WARMUP_ROUNDS = 2;

    private ReportCommand() {}

    static ReportConfig config(String[] argv) {
        Args a = new Args("report", argv, OPTIONS, FLAGS);
        if (!a.positional().isEmpty()) {
            throw new Args.UsageException("report takes no positional arguments: " + a.positional());
        }
        if (a.has("full") && a.has("quick")) {
            throw new Args.UsageException("report: --full and --quick exclude each other");
        }
        boolean full = a.has("full");
        boolean quick = a.has("quick");
        ModelShape shape = ModelShape.from(a, Defaults.LAYERS, Defaults.KV_HEADS, Defaults.HEAD_DIM, Defaults.PAGE_SIZE_TOKENS);
        int poolPages = a.getInt("pool-pages", Defaults.POOL_PAGES);
        PoolGeometry geometry = shape.geometry(shape.layers(), poolPages);
        String note = shape.description() + (a.has("preset") && !a.has("layers") ? ""
                : "; layers simulated: " + shape.layers() + " (every byte cost scales with layers, so ratios hold)");
        if (!a.has("preset") && !a.has("kv-heads") && !a.has("head-dim")) {
            note = "one layer shape of a Llama-3.1-8B-class model, " + note;
        }
        long seed = a.getLong("seed", Defaults.SEED);
        int requests = a.getInt("requests", quick ? 16 : full ? Defaults.FULL_REQUESTS : Defaults.REQUESTS);
        Map<String, Object> params = new LinkedHashMap<>();
        Trace trace;
        if (a.has("trace")) {
            trace = TraceCsv.read(Path.of(a.get("trace", "")), geometry.pageSizeTokens());
            params.put("file", a.get("trace", ""));
        } else {
            TraceSpec spec = traceSpec(a, requests, seed);
            trace = SyntheticTraces.generate(spec, geometry.pageSizeTokens());
            params.put("arrivalsPerStep", spec.arrivalsPerStep());
            params.put("promptTokens", spec.prompt().toString());
            params.put("outputTokens", spec.output().toString());
            params.put("prefixTokens", spec.prefixTokens() / geometry.pageSizeTokens() * geometry.pageSizeTokens());
            params.put("prefixFraction", spec.prefixFraction());
            params.put("abortFraction", spec.abortFraction());
            params.put("handoffFraction", spec.handoffFraction());
        }
        List<Level> levels = new ArrayList<>();
        for (String l : a.get("levels", "stock,none,zero,encrypt,compliance").split(",")) {
            levels.add(Level.parse(l));
        }
        int rounds = a.getInt("rounds", quick ? 2 : full ? Defaults.FULL_ROUNDS : Defaults.ROUNDS);
        int warmup = a.getInt("warmup", quick ? 1 : Defaults.WARMUP_ROUNDS);
        if (warmup < 0) {
            throw new Args.UsageException("--warmup must be >= 0, not " + warmup);
        }
        double modelStepMillis = a.getDouble("model-step-ms", Defaults.MODEL_STEP_MILLIS);
        if (!(modelStepMillis > 0) || Double.isInfinite(modelStepMillis)) {
            throw new Args.UsageException("--model-step-ms must be a positive number of milliseconds, not " + a.get("model-step-ms", ""));
        }
        SimulationOptions sim = new SimulationOptions(a.getInt("max-running", Defaults.MAX_RUNNING), Defaults.PREFILL_TOKENS_PER_STEP,
                a.getInt("resident-prefixes", Defaults.RESIDENT_PREFIXES), false);
        Path out = Path.of(a.get("out", "target/kvshield-report"));
        return new ReportConfig(geometry, note, trace, params, seed, levels, Backends.checkName(a.get("backend", "cpu")), rounds,
                warmup, warmup == 0 ? 0 : warmup + EXTRA_WARMUP_ROUNDS, Pairing.LOCKSTEP, modelStepMillis, sim, 64L << 20, out,
                a.has("jmh") ? Path.of(a.get("jmh", "")) : null);
    }

    static TraceSpec traceSpec(Args a, int requests, long seed) {
        return new TraceSpec(a.getInt("tenants", Defaults.TENANTS), requests, a.getDouble("arrivals", Defaults.ARRIVALS_PER_STEP),
                LengthDistribution.parse(a.get("prompt", Defaults.PROMPT_TOKENS)),
                LengthDistribution.parse(a.get("output", Defaults.OUTPUT_TOKENS)), a.getInt("prefix-tokens", Defaults.PREFIX_TOKENS),
                a.getDouble("prefix-fraction", Defaults.PREFIX_FRACTION), a.getDouble("abort-fraction", Defaults.ABORT_FRACTION),
                a.getDouble("handoff-fraction", Defaults.HANDOFF_FRACTION), Defaults.MAX_PROMPT_TOKENS, seed);
    }

    static int run(String[] argv, PrintStream out, PrintStream progress) {
        ReportConfig config = config(argv);
        Args a = new Args("report", argv, OPTIONS, FLAGS);
        if (a.has("sweep")) {
            return sweep(a, config, out, progress);
        }
        ReportData data;
        List<Path> files;
        try (ReportLog log = new ReportLog(config.outDir(), a.has("verbose") ? progress : null)) {
            data = ReportRunner.withClassPath(config, progress).run();
            files = new ArrayList<>(ReportWriter.write(data, config.outDir()));
            files.add(log.path());
        }
        out.print(ReportWriter.terminalSummary(data));
        out.println("report written to " + config.outDir().toAbsolutePath() + ": "
                + String.join(", ", files.stream().map(f -> f.getFileName().toString()).toList()));
        data.skipped().forEach((what, why) -> out.println("skipped " + what + ": " + why));
        return 0;
    }

    /** {@code --sweep}: page size x sync/async x release lag per level; writes sweep.md and sweep.json. */
    private static int sweep(Args a, ReportConfig config, PrintStream out, PrintStream progress) {
        if (a.has("trace")) {
            throw new Args.UsageException("report --sweep draws its own synthetic trace per page size; drop --trace");
        }
        PoolGeometry g = config.geometry();
        int basePage = g.pageSizeTokens();
        if (basePage < 2) {
            throw new Args.UsageException("report --sweep halves the page size: --page-size must be at least 2");
        }
        long kvBytes = g.pageBytesAllBuffers() * (g.pageCount() - 1L);
        java.util.function.IntFunction<PoolGeometry> geometryAt = page -> {
            int[] bpt = new int[g.buffersPerLayer()];
            for (int b = 0; b < bpt.length; b++) {
                bpt[b] = g.bytesPerToken(b);
            }
            long pageBytes = g.bytesPerTokenAllBuffers() * page;
            return PoolGeometry.builder().layers(g.layers()).buffers(g.kinds(), bpt).pageSizeTokens(page)
                    .pageCount((int) (kvBytes / pageBytes) + 1).build();
        };
        int requests = config.trace().requests().size();
        dev.kvshield.perf.simulate.Availability<dev.kvshield.protection.PageSealerFactory> sealer =
                dev.kvshield.perf.simulate.Sealers.hostSealer();
        List<Level> levels = new ArrayList<>();
        levels.add(Level.STOCK);
        for (Level l : config.levels()) {
            if (l != Level.STOCK && !levels.contains(l) && (l != Level.ENCRYPT || sealer.available())) {
                levels.add(l);
            }
        }
        if (config.levels().contains(Level.ENCRYPT) && !sealer.available()) {
            out.println("skipped level encrypt: " + sealer.reason());
        }
        int rounds = a.getInt("rounds", 2);
        dev.kvshield.perf.report.Sweep.Result r = dev.kvshield.perf.report.Sweep.run(geometryAt,
                traceSpec(a, requests, config.seed()), levels, sealer.value(), config.simulation(), rounds, basePage, progress);
        String md = dev.kvshield.perf.report.Sweep.markdown(r, dev.kvshield.perf.report.MachineInfo.current());
        try {
            java.nio.file.Files.createDirectories(config.outDir());
            java.nio.file.Files.writeString(config.outDir().resolve("sweep.md"), md);
            java.nio.file.Files.writeString(config.outDir().resolve("sweep.json"),
                    dev.kvshield.perf.report.Json.write(dev.kvshield.perf.report.Sweep.toJson(r)));
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException("cannot write the sweep into " + config.outDir(), e);
        }
        out.print(md);
        out.println("sweep written to " + config.outDir().toAbsolutePath().resolve("sweep.md") + " and sweep.json");
        return 0;
    }
}
