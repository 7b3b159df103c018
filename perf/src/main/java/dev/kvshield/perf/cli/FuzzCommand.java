package dev.kvshield.perf.cli;

import dev.kvshield.perf.fuzz.Campaign;
import dev.kvshield.perf.fuzz.Finding;
import dev.kvshield.perf.fuzz.FuzzTrace;
import dev.kvshield.perf.fuzz.Fuzzer;
import dev.kvshield.perf.fuzz.Rig;
import dev.kvshield.perf.fuzz.TraceGenerator;
import dev.kvshield.perf.fuzz.TraceRunner;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * {@code fuzz --replay FILE}: replays a trace file and prints what it shows. {@code fuzz
 * [--minutes N | --traces N] [--seed S] [--out DIR] [--levels L,...]}: a campaign of generated
 * traces (fresh seed unless given), findings minimised into DIR (default
 * {@code target/kvshield-fuzz}); it ends with its rates and {@code findings: N}. Exit code 0 when
 * nothing was found, 2 when something was.
 */
final class FuzzCommand {
    static final double MAX_MINUTES = 7 * 24 * 60;

    private FuzzCommand() {}

    static int run(String[] argv, PrintStream out, PrintStream err) {
        Args a = new Args("fuzz", argv, Set.of("replay", "minutes", "traces", "seed", "out", "levels"), Set.of());
        if (!a.positional().isEmpty()) {
            throw new Args.UsageException("fuzz takes no positional arguments: " + a.positional());
        }
        // Every fuzz pool opens a keyring and says so at INFO: thousands of lines that bury the findings.
        java.util.logging.Logger.getLogger("dev.kvshield.keys").setLevel(java.util.logging.Level.WARNING);
        // Traces arm backend faults on purpose, and the pool logs each failed protection batch: the campaign counts them instead.
        java.util.logging.Logger.getLogger("dev.kvshield.pool").setLevel(java.util.logging.Level.OFF);
        Availability<PageSealerFactory> sealer = Sealers.hostSealer();
        TraceRunner runner = new TraceRunner(sealer.available() ? sealer.value() : null);
        Fuzzer fuzzer = new Fuzzer(runner, () -> Rig.CLEAN);
        if (a.has("replay")) {
            for (String other : List.of("minutes", "traces", "seed", "out", "levels")) {
                if (a.has(other)) {
                    throw new Args.UsageException("fuzz --replay takes no --" + other);
                }
            }
            return replay(Path.of(a.get("replay", "")), runner, fuzzer, out, err);
        }
        double minutes = a.getDouble("minutes", a.has("traces") ? MAX_MINUTES : 1);
        if (!(minutes > 0 && minutes <= MAX_MINUTES)) {
            throw new Args.UsageException("--minutes must be in (0, " + (long) MAX_MINUTES + "], not " + a.get("minutes", ""));
        }
        long traces = a.getLong("traces", Long.MAX_VALUE);
        if (traces < 1) {
            throw new Args.UsageException("--traces must be >= 1, not " + traces);
        }
        long seed = a.has("seed") ? a.getLong("seed", 0) : System.nanoTime() ^ System.currentTimeMillis() * 0x9E3779B97F4A7C15L;
        List<ProtectionLevel> levels = levels(a.get("levels", "none,zero,encrypt,compliance"));
        if (levels.stream().anyMatch(ProtectionLevel::needsKeySource) && !sealer.available()) {
            err.println("kvshield fuzz: leaving out " + levels.stream().filter(ProtectionLevel::needsKeySource).map(l -> l.name().toLowerCase(java.util.Locale.ROOT)).toList()
                    + ": " + sealer.reason());
            levels = levels.stream().filter(l -> !l.needsKeySource()).toList();
            if (levels.isEmpty()) {
                return 2;
            }
        }
        Path dir = Path.of(a.get("out", "target/kvshield-fuzz"));
        out.println("fuzz campaign: seed " + seed + ", levels " + levels.toString().toLowerCase(Locale.ROOT) + ", findings to " + dir);
        Campaign.Summary s = new Campaign(TraceGenerator.any(levels), fuzzer, seed, traces, (long) (minutes * 60e9), false, dir, out)
                .run();
        out.println(s.closing());
        return s.findings().isEmpty() ? 0 : 2;
    }

    private static int replay(Path file, TraceRunner runner, Fuzzer fuzzer, PrintStream out, PrintStream err) {
        FuzzTrace trace;
        try {
            trace = FuzzTrace.read(file);
        } catch (IOException e) {
            throw new Args.UsageException("fuzz --replay: cannot read " + file + ": " + e.getMessage());
        } catch (java.io.UncheckedIOException e) {
            throw new Args.UsageException("fuzz --replay: " + file + " is not text: " + e.getMessage());
        }
        if (!runner.supports(trace.config().level())) {
            err.println("kvshield fuzz: the trace runs at encrypt and no key source is available here");
            return 2;
        }
        Fuzzer.Check c = fuzzer.check(trace);
        out.println("replayed " + file + ": " + trace.requests().size() + " requests, " + trace.events().size() + " events, "
                + c.result().readBack().size() + " read back, " + c.result().rejections() + " misuses refused");
        for (Finding f : c.findings()) {
            out.println("  " + f);
        }
        out.println("findings: " + c.findings().size());
        return c.clean() ? 0 : 2;
    }

    private static List<ProtectionLevel> levels(String csv) {
        List<ProtectionLevel> out = new ArrayList<>();
        for (String s : csv.split(",")) {
            String name = s.trim().toUpperCase(Locale.ROOT);
            try {
                out.add(ProtectionLevel.valueOf(name));
            } catch (IllegalArgumentException e) {
                throw new Args.UsageException("--levels: unknown level '" + s.trim() + "'; allowed: none, zero, encrypt, compliance");
            }
        }
        return out;
    }
}
