package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.perf.cli.Main;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Hostile command lines for every lab subcommand: random and boundary values, unknown options,
 * malformed trace and CSV files. Each call ends with a known exit code (0, 1, 2 or 64) and, when it
 * fails, one message naming what was wrong — never an exception escaping or a stack trace.
 */
class CliFuzzTest {
    static final long SEED = 31;
    static final int CALLS = 250;
    static final String[] VALUES = {"-1", "0", "1", "2", "-2147483649", "2147483648", "9223372036854775808", "1e309", "NaN",
        "-0.5", "0.001", "", " ", "abc", "--", "=", "zero", "ZERO", "encrypt,bogus", "none,zero", "stock", "compliance",
        "\u0000", "\u00e9t\u00e9", "/nonexistent/file", "..", "llama-3-8b", "bf16", "fp8", "uniform:4:2", "fixed:-3",
        "lognormal:0:0", "oversized-handoff", "late-writer", "nope"};

    @TempDir
    Path dir;

    record Run(int code, String out, String err) {}

    static Run run(List<String> args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int code = Main.run(args.toArray(String[]::new), new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(err, true, StandardCharsets.UTF_8));
        return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
    }

    private List<Path> badFiles() throws IOException {
        List<Path> files = new ArrayList<>();
        String[] contents = {"", "kvshield-fuzz-trace 1\n", "kvshield-fuzz-trace 2\nconfig level=ZERO\n",
            "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=1 tenants=1\n",
            "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=6 tenants=1\nrequest 1 tenant=3 kind=local tokens=4"
                    + " prefix=-1 drop=-1\n",
            "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=6 tenants=1\nevent adv 9\n",
            "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=6 tenants=1\nevent step 3\n",
            "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=999999999 tenants=1\n",
            "arrival_step,tenant,prompt_tokens\nx,y,z\n", "arrival_step,tenant,prompt_tokens,output_tokens\n-1,-1,-1,-1\n",
            "\u0000\u0001\u0002garbage"};
        for (int i = 0; i < contents.length; i++) {
            Path f = dir.resolve("bad-" + i + (i >= 8 && i < 10 ? ".csv" : ".trace"));
            Files.writeString(f, contents[i]);
            files.add(f);
        }
        Path binary = dir.resolve("binary.trace");
        Files.write(binary, new byte[] {(byte) 0xff, (byte) 0xfe, 0, (byte) 0xc3, 0x28});
        files.add(binary);
        files.add(dir.resolve("missing.trace"));
        files.add(dir);
        return files;
    }

    @Test
    void everySubcommandFailsCleanlyOnHostileArguments() throws IOException {
        SplittableRandom rnd = new SplittableRandom(SEED);
        List<Path> files = badFiles();
        String[] checkConfig = {"--preset", "--layers", "--kv-heads", "--head-dim", "--latent-dim", "--dtype", "--page-size",
            "--gpu-memory-gib", "--pool-tokens", "--context", "--headroom", "--bogus"};
        int failures = 0;
        for (int i = 0; i < CALLS; i++) {
            List<String> args = new ArrayList<>();
            switch (rnd.nextInt(5)) {
                case 0 -> {
                    args.add("check-config");
                    for (int k = rnd.nextInt(6); k > 0; k--) {
                        args.add(checkConfig[rnd.nextInt(checkConfig.length)]);
                        if (rnd.nextInt(6) > 0) {
                            args.add(VALUES[rnd.nextInt(VALUES.length)]);
                        }
                    }
                }
                case 1 -> {
                    args.add("replay-incident");
                    for (int k = rnd.nextInt(4); k > 0; k--) {
                        args.add(rnd.nextBoolean() ? "--level" : VALUES[rnd.nextInt(VALUES.length)]);
                    }
                }
                case 2 -> {
                    args.addAll(List.of("fuzz", "--replay", files.get(rnd.nextInt(files.size())).toString()));
                    if (rnd.nextInt(3) == 0) {
                        args.addAll(List.of(rnd.nextBoolean() ? "--seed" : "--minutes", VALUES[rnd.nextInt(VALUES.length)]));
                    }
                }
                case 3 -> {
                    // A campaign bounded to one trace, with hostile values for the other options.
                    args.addAll(List.of("fuzz", "--traces", rnd.nextBoolean() ? "1" : VALUES[rnd.nextInt(VALUES.length)], "--out",
                            dir.resolve("out").toString()));
                    String[] opts = {"--seed", "--levels", "--minutes", "--bogus"};
                    args.addAll(List.of(opts[rnd.nextInt(opts.length)], VALUES[rnd.nextInt(VALUES.length)]));
                }
                default -> {
                    // Report with a malformed trace and an invalid level, so no call starts a real measurement.
                    args.addAll(List.of("report", "--trace", files.get(rnd.nextInt(files.size())).toString(), "--levels", "bogus",
                            "--out", dir.resolve("report").toString()));
                    if (rnd.nextBoolean()) {
                        args.addAll(List.of("--rounds", VALUES[rnd.nextInt(VALUES.length)]));
                    }
                }
            }
            Run r;
            try {
                r = run(args);
            } catch (RuntimeException e) {
                throw new AssertionError("call " + i + " " + args + " let an exception escape", e);
            }
            assertTrue(Set.of(0, 1, 2, 64).contains(r.code()), "call " + i + " " + args + " exit " + r.code() + ": " + r.err());
            assertFalse(r.err().contains("\tat ") || r.out().contains("\tat "), "call " + i + " " + args + " printed a stack trace");
            if (r.code() != 0) {
                failures++;
                assertTrue(r.err().startsWith("kvshield"), "call " + i + " " + args + " failed without a message: " + r.err());
            }
        }
        assertTrue(failures > CALLS / 2, "most hostile calls must fail: " + failures);
    }

    @Test
    void aMalformedTraceNamesItsLine() throws IOException {
        Path f = dir.resolve("t.trace");
        Files.writeString(f, "kvshield-fuzz-trace 1\nconfig level=ZERO mode=SYNCHRONOUS lag=0 pages=6 tenants=1\nevent jump 1\n");
        Run r = run(List.of("fuzz", "--replay", f.toString()));
        assertEquals(64, r.code());
        assertTrue(r.err().contains("trace line 3: event action 'jump' is not one of"), r.err());
    }
}
