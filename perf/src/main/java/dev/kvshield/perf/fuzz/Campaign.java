package dev.kvshield.perf.fuzz;

import java.io.IOException;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Runs generated traces through a {@link Fuzzer} until a trace count or a time budget runs out
 * (or, when asked, the first finding); each finding is minimised and, given a directory, written
 * there as a trace file that {@code ./kvshield fuzz --replay FILE} replays. Trace {@code i} of a
 * campaign with seed {@code s} is generated from {@link #traceSeed(long, long) traceSeed(s, i)}.
 *
 * @param outDir where minimised findings are written, or {@code null}
 * @param progress a line per finding, or {@code null}
 */
public record Campaign(TraceGenerator generator, Fuzzer fuzzer, long seed, long maxTraces, long budgetNanos, boolean stopAtFirst,
        Path outDir, PrintStream progress) {
    /** One finding: the seed of the trace that showed it, the minimised trace, and the file it went to (or null). */
    public record Found(long traceSeed, Finding finding, FuzzTrace minimized, Path file) {}

    /**
     * @param events events run in the campaign's traces (not counting the solo runs)
     * @param eventsChecked every event run, solo runs included
     * @param firstFindingNanos time from the start to the first finding, or -1
     * @param refusals hostile lease batches refused as the contract says (the campaign's traces)
     * @param exhaustions calls refused whole because the lease ids or claim slots ran out
     * @param protectionFailures pages whose protection failed (armed faults, raced reclaims, failed verification)
     */
    public record Summary(long traces, long events, long eventsChecked, long nanos, List<Found> findings, long firstFindingNanos,
            long tracesToFirstFinding, long refusals, long exhaustions, long protectionFailures) {
        public double tracesPerSecond() {
            return traces / Math.max(1e-9, nanos / 1e9);
        }

        public double eventsPerSecond() {
            return events / Math.max(1e-9, nanos / 1e9);
        }

        /** The campaign's closing lines: rates, what the lease checks saw, then {@code findings: N}. */
        public String closing() {
            return String.format(Locale.ROOT, "traces: %d in %.1f s (%.0f traces/s), events: %d (%.0f events/s, %d with solo runs)%n"
                    + "lease checks: %d hostile batches refused (%.0f/s), %d calls refused whole for want of ids or claim slots,"
                    + " %d pages whose protection failed%nfindings: %d", traces, nanos / 1e9, tracesPerSecond(), events, eventsPerSecond(), eventsChecked,
                    refusals, refusals / Math.max(1e-9, nanos / 1e9), exhaustions, protectionFailures, findings.size());
        }
    }

    /** SplitMix64 of the campaign seed's {@code index}-th step: distinct, well-spread seeds per trace. */
    public static long traceSeed(long campaignSeed, long index) {
        long z = campaignSeed + (index + 1) * 0x9E37_79B9_7F4A_7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58_476D_1CE4_E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D0_49BB_1331_11EBL;
        return z ^ (z >>> 31);
    }

    public Summary run() {
        long start = System.nanoTime();
        List<Found> found = new ArrayList<>();
        long traces = 0;
        long events = 0;
        long checked = 0;
        long first = -1;
        long tracesToFirst = -1;
        long refusals = 0;
        long exhaustions = 0;
        long failures = 0;
        Minimizer minimizer = new Minimizer(fuzzer, 400);
        while (traces < maxTraces && System.nanoTime() - start < budgetNanos) {
            long s = traceSeed(seed, traces);
            FuzzTrace trace = generator.generate(s);
            if (!fuzzer.runner().supports(trace.config().level())) {
                traces++;
                continue;
            }
            Fuzzer.Check c = fuzzer.check(trace);
            traces++;
            events += c.result().events();
            checked += c.eventsRun();
            refusals += c.result().refusals();
            exhaustions += c.result().exhaustions();
            failures += c.result().protectionFailures();
            if (!c.clean()) {
                if (first < 0) {
                    first = System.nanoTime() - start;
                    tracesToFirst = traces;
                }
                Finding f = c.findings().get(0);
                FuzzTrace small = minimizer.minimize(trace, f.kind());
                Finding shown = fuzzer.check(small).findings().stream().filter(x -> x.kind() == f.kind()).findFirst().orElse(f);
                Path file = write(small, s, shown);
                found.add(new Found(s, shown, small, file));
                if (progress != null) {
                    progress.println("finding (trace seed " + s + ", " + trace.events().size() + " events, minimised to "
                            + small.requests().size() + " requests and " + small.events().size() + " events): " + shown
                            + (file == null ? "" : "\n  replay: ./kvshield fuzz --replay " + file));
                }
                if (stopAtFirst) {
                    break;
                }
            }
        }
        return new Summary(traces, events, checked, System.nanoTime() - start, List.copyOf(found), first, tracesToFirst, refusals,
                exhaustions, failures);
    }

    private Path write(FuzzTrace trace, long traceSeed, Finding f) {
        if (outDir == null) {
            return null;
        }
        try {
            Files.createDirectories(outDir);
            Path file = outDir.resolve("finding-" + Long.toUnsignedString(traceSeed, 16) + ".trace");
            Files.writeString(file, "# " + f.toString().replace('\n', ' ') + "\n" + trace.format());
            return file;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write the finding to " + outDir + ": " + e.getMessage(), e);
        }
    }
}
