package dev.kvshield.perf.cli;

import java.io.PrintStream;
import java.util.Arrays;

/**
 * The lab's command line: {@code report}, {@code replay-incident}, {@code check-config}, {@code fuzz}.
 * Exit codes: 0 done, 2 a check failed ({@code check-config}) or findings ({@code fuzz}), 64 a usage
 * error, 1 anything else.
 */
public final class Main {
    private Main() {}

    public static void main(String[] args) {
        System.setProperty("java.awt.headless", "true");
        System.exit(run(args, System.out, System.err));
    }

    /** Runs one subcommand and returns its exit code (tests call this directly). */
    public static int run(String[] args, PrintStream out, PrintStream err) {
        if (args.length == 0) {
            err.println(usage());
            return 64;
        }
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        if (Arrays.asList(rest).contains("--help") || Arrays.asList(rest).contains("-h")) {
            out.println(usage());
            return 0;
        }
        try {
            return switch (args[0]) {
                case "report" -> ReportCommand.run(rest, out, err);
                case "check-config" -> CheckConfigCommand.run(rest, out);
                case "replay-incident" -> ReplayCommand.run(rest, out, err);
                case "fuzz" -> FuzzCommand.run(rest, out, err);
                case "help", "--help", "-h" -> {
                    out.println(usage());
                    yield 0;
                }
                default -> throw new Args.UsageException("unknown command '" + args[0] + "'");
            };
        } catch (Args.UsageException | IllegalArgumentException e) {
            err.println("kvshield: " + e.getMessage());
            err.println(usage());
            return 64;
        } catch (java.io.UncheckedIOException e) {
            // A file named on the command line could not be read or written: say which, no stack trace.
            err.println("kvshield: " + e.getMessage());
            return 1;
        }
    }

    static String usage() {
        return """
                usage: kvshield <command> [options]
                  report [--quick|--full|--sweep] [--out DIR] [--backend cpu|cuda] [--rounds N] [--warmup N]
                         [--levels stock,none,zero,encrypt,compliance] [--seed N] [--jmh JMH-RESULT.json]
                         [--model-step-ms MS] [--verbose]
                         Pairs every level (stock too) with its own stock runs on the same trace, in lockstep, two
                         legs that swap memory regions, for --rounds rounds (default 3; --full 8 on a trace twice as
                         long, --quick 2 on a short one) after at least --warmup passes (default 2;
                         more, up to 2 extra, while the JIT is busy). Prints per level the median ratio to stock with
                         its spread (min-max over pairs, as +-%), the allocator's time per scheduler step (p50, p99, in
                         microseconds) and its share of a --model-step-ms model step (default 10: a decode step of an 8B
                         model on one GPU). Writes report.md, report.html, report.json, chart PNGs and report.log
                         (library logging; --verbose shows it on the terminal too).
                         geometry: [--preset NAME | --layers N --kv-heads N --head-dim N | --layers N --latent-dim N]
                                   [--dtype bf16|fp16|fp8|fp32] [--page-size N] [--pool-pages N]
                         trace:    [--trace FILE.csv] | [--requests N] [--tenants N] [--arrivals PER_STEP]
                                   [--prompt DIST] [--output DIST] (DIST: fixed:N, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA)
                                   [--prefix-tokens N] [--prefix-fraction F] [--abort-fraction F] [--handoff-fraction F]
                         engine:   [--max-running N] [--resident-prefixes N]
                  replay-incident oversized-handoff|late-writer|lease-expiry --level stock|none|zero|encrypt|compliance [--json]
                  check-config (--preset NAME | --layers N --kv-heads N --head-dim N | --layers N --latent-dim N) [--dtype bf16]
                         [--page-size N] (--gpu-memory-gib GIB | --pool-tokens N) [--context TOKENS] [--headroom FRACTION]
                  fuzz --replay FILE | fuzz [--minutes N | --traces N] [--seed S] [--out DIR] [--levels none,zero,encrypt,compliance]
                  presets:""" + " " + String.join(", ", ModelPresets.ALL.keySet());
    }
}
