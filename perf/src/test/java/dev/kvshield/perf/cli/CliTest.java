package dev.kvshield.perf.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The command line on tiny configurations: exit codes, files written, messages that name the values. */
class CliTest {
    record Run(int code, String out, String err) {}

    static Run run(String... args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int code = Main.run(args, new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(err, true, StandardCharsets.UTF_8));
        return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
    }

    @Test
    void reportWritesEveryFileWithEveryLevel(@TempDir Path dir) throws IOException {
        Run r = run(reportArgs(dir));
        assertEquals(0, r.code(), r.err());
        for (String f : new String[] {"report.json", "report.md", "report.html", "throughput-ratio.png", "step-latency.png",
                "allocator-time.png", "protection-bandwidth.png", "report.log"}) {
            assertTrue(Files.size(dir.resolve(f)) > 100, f);
        }
        assertTrue(!r.out().contains("skipped"), "tenant-keys is on the class path, so nothing is skipped: " + r.out());
        assertTrue(r.err().contains("kvshield report:"), "a progress line: " + r.err());
        assertTrue(r.out().startsWith("level ") && r.out().contains("ratio to stock") && r.out().contains("\ncompliance "),
                "the summary table: " + r.out());
        String html = Files.readString(dir.resolve("report.html"));
        assertTrue(html.contains("data:image/png;base64,"), "charts embedded");
        assertTrue(!html.contains("src=\"throughput"), "no external image references");
        String md = Files.readString(dir.resolve("report.md"));
        for (String level : new String[] {"stock", "none", "zero", "encrypt", "compliance"}) {
            assertTrue(md.contains("| " + level + " | ") && !md.contains("| " + level + " | skipped"), md);
        }
    }

    /**
     * The terminal gets the progress line and the summary; key management's INFO lines go to
     * report.log (in a folder whose name has the log file pattern's '%' in it).
     */
    @Test
    void libraryLoggingGoesToTheLogFileNotTheTerminal(@TempDir Path tmp) throws IOException {
        Path dir = tmp.resolve("out%t%u");
        java.util.logging.Handler[] before = java.util.logging.Logger.getLogger("").getHandlers();
        Run r = withKeyManagementAtInfo(() -> run(reportArgs(dir, "--levels", "encrypt")));
        assertEquals(0, r.code(), r.err());
        String terminal = r.out() + r.err();
        for (String logged : new String[] {"INFO", "WARNING", "dev.kvshield.keys", "tenant keyring", "is current for new seals"}) {
            assertTrue(!terminal.contains(logged), "no log line on the terminal (" + logged + "): " + terminal);
        }
        for (String line : r.err().split("[\r\n]+")) {
            assertTrue(line.isBlank() || line.startsWith("kvshield report: "), "only the progress line on stderr: '" + line + "'");
        }
        String log = Files.readString(dir.resolve("report.log"));
        assertTrue(log.contains("WARNING: using an ephemeral random root key") && log.contains("INFO: ")
                && log.contains("tenant keyring opened") && log.contains("is current for new seals"), log);
        assertTrue(java.util.Arrays.equals(before, java.util.logging.Logger.getLogger("").getHandlers()),
                "the JVM's log handlers are back as they were");
    }

    @Test
    void verboseAlsoShowsTheLogOnTheTerminal(@TempDir Path dir) {
        Run r = withKeyManagementAtInfo(() -> run(reportArgs(dir, "--levels", "encrypt", "--verbose")));
        assertEquals(0, r.code(), r.err());
        assertTrue(r.err().contains("\nINFO: ") && r.err().contains("tenant keyring opened"), r.err());
        assertTrue(!r.out().contains("INFO"), "the log goes where the progress line goes: " + r.out());
    }

    /**
     * Runs {@code body} with tenant-keys' loggers at the JVM's default level: {@code fuzz} turns them
     * down to WARNING for the rest of the JVM, and another test may have run it first.
     */
    static Run withKeyManagementAtInfo(java.util.function.Supplier<Run> body) {
        java.util.logging.Logger keys = java.util.logging.Logger.getLogger("dev.kvshield.keys");
        java.util.logging.Level level = keys.getLevel();
        keys.setLevel(null);
        try {
            return body.get();
        } finally {
            keys.setLevel(level);
        }
    }

    @Test
    void badModelStepOrWarmupIsAUsageError() {
        assertUsageError("--model-step-ms must be a positive number of milliseconds, not 0", "report", "--model-step-ms", "0");
        assertUsageError("--model-step-ms must be a number, not 'ten'", "report", "--model-step-ms", "ten");
        assertUsageError("--warmup must be >= 0, not -1", "report", "--warmup", "-1");
    }

    /** Exit code 64 with {@code message} on stderr. */
    static void assertUsageError(String message, String... args) {
        Run r = run(args);
        assertEquals(64, r.code(), r.err());
        assertTrue(r.err().contains(message), r.err());
    }

    static String[] reportArgs(Path dir, String... extra) {
        String[] args = ReportSchemaTest.tinyArgs(dir, extra);
        String[] withCommand = new String[args.length + 1];
        withCommand[0] = "report";
        System.arraycopy(args, 0, withCommand, 1, args.length);
        return withCommand;
    }

    @Test
    void sweepRecommendsASettingPerLevel(@TempDir Path dir) throws IOException {
        Run r = run(reportArgs(dir, "--sweep", "--levels", "none,zero"));
        assertEquals(0, r.code(), r.err());
        String md = Files.readString(dir.resolve("sweep.md"));
        assertTrue(md.contains("- none: ") && md.contains("- zero: "), md);
        assertTrue(md.contains("| zero | 2-token pages, async, lag 2 |"), md);
        assertTrue(Files.readString(dir.resolve("sweep.json")).contains("\"recommended\""));
    }

    @Test
    void replayIncidentPrintsItsJsonSummaryAndExitsZeroWhateverItFound() {
        Run stock = run("replay-incident", "late-writer", "--level", "stock", "--json");
        assertEquals(0, stock.code(), stock.err());
        assertTrue(stock.out().startsWith("{") && stock.out().contains("\"leakedResponses\": 1"), stock.out());
        Run none = run("replay-incident", "late-writer", "--level", "none");
        assertEquals(0, none.code(), none.err());
        assertTrue(none.out().contains("no response carried another request's data") && none.out().contains("\"leakedResponses\": 0"),
                none.out());
        Run encrypt = run("replay-incident", "lease-expiry", "--level", "encrypt", "--json");
        assertEquals(0, encrypt.code(), encrypt.err());
        assertTrue(encrypt.out().contains("\"level\": \"encrypt\"") && encrypt.out().contains("\"leakedResponses\": 0"), encrypt.out());
        Run unknown = run("replay-incident", "meltdown", "--level", "zero");
        assertEquals(64, unknown.code());
        assertTrue(unknown.err().contains("unknown incident 'meltdown'; allowed: oversized-handoff, late-writer, lease-expiry"),
                unknown.err());
    }

    @Test
    void checkConfigSaysOkWhenThePoolHoldsAMaxLengthRequest() {
        Run r = run("check-config", "--preset", "llama-3.1-8b", "--gpu-memory-gib", "40", "--context", "131072", "--headroom", "0.1");
        assertEquals(0, r.code(), r.out() + r.err());
        assertTrue(r.out().contains("OK: the pool holds a max-length request of 131072 tokens"), r.out());
    }

    @Test
    void checkConfigExitsTwoWithBothNumbersWhenItDoesNot() {
        // 8 GiB of KV at 128 KiB per token is 65536 token slots: less than a 131072-token request.
        Run r = run("check-config", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bf16", "--gpu-memory-gib", "8",
                "--context", "131072");
        assertEquals(2, r.code(), r.out() + r.err());
        assertTrue(r.out().contains("advertised 131072 tokens, pool holds 65520"), r.out());
    }

    @Test
    void checkConfigCountsHeadroomAgainstThePool() {
        Run fits = run("check-config", "--preset", "mistral-7b", "--pool-tokens", "40000", "--context", "32768");
        Run tight = run("check-config", "--preset", "mistral-7b", "--pool-tokens", "40000", "--context", "32768", "--headroom", "0.25");
        assertEquals(0, fits.code(), fits.out());
        assertEquals(2, tight.code(), tight.out());
        assertTrue(tight.out().contains("pool holds 30000"), tight.out());
    }

    /** An oracle round that reused no page says so: its leak and residue figures saw no reuse (here every prompt is too long). */
    @Test
    void aReportWhoseOracleRoundReusedNoPageWarns(@TempDir Path dir) throws IOException {
        Run r = run("report", "--requests", "4", "--rounds", "1", "--warmup", "0", "--pool-pages", "48", "--layers", "1", "--kv-heads", "1",
                "--head-dim", "8", "--page-size", "4", "--prompt", "uniform:400:400", "--output", "uniform:2:8", "--tenants", "2",
                "--levels", "zero", "--out", dir.toString());
        assertEquals(0, r.code(), r.err());
        String warning = "Warning: the oracle round reused no pages under stock, zero: its leak and residue figures there exercised no"
                + " page reuse.";
        assertTrue(r.out().contains(warning), r.out());
        assertTrue(Files.readString(dir.resolve("report.md")).contains(warning));
        assertTrue(!run(reportArgs(dir.resolve("fits"), "--levels", "zero")).out().contains("Warning:"), "a trace that fits reuses pages");
    }

    /** The pool's own exact headroom arithmetic at an exact fit and one token either side of it (1-token pages: 90 slots). */
    @Test
    void checkConfigAgreesWithThePoolAtAnExactFitWithHeadroom() {
        String[] pool = {"check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "1", "--pool-tokens", "90",
            "--headroom", "0.3", "--context"};
        Run exact = run(concat(pool, "63"));
        assertEquals(0, exact.code(), exact.out());
        assertTrue(exact.out().contains("pool holds:       63 tokens") && exact.out().contains("(0 tokens to spare)"), exact.out());
        assertEquals(0, run(concat(pool, "62")).code());
        Run over = run(concat(pool, "64"));
        assertEquals(2, over.code(), over.out());
        // 64 / 0.7 = 91.43: 92 slots, 93 pages with page 0; 91 slots would hold only 63.
        assertTrue(over.out().contains("pool holds 63; kvshield would admit only requests up to 63 tokens. Needed: 93 pages"), over.out());
        Run ninety = run("check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "1", "--pool-tokens", "100",
                "--headroom", "0.9", "--context", "10");
        assertEquals(0, ninety.code(), "100 slots less 90% hold 10 (9.999999999999998 in doubles): " + ninety.out());
    }

    /** Pool sizes at the page index's limit: exactly the most pages a pool can index, and one more. */
    @Test
    void checkConfigSaysWhenAPoolHasMorePagesThanItsIndexHolds() {
        String[] shape = {"check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "1", "--context", "16"};
        Run most = run(concat(shape, "--pool-tokens", "2147483646"));
        assertEquals(0, most.code(), "2147483646 slots + page 0 = 2147483647 pages: " + most.out());
        Run oneMore = run(concat(shape, "--pool-tokens", "2147483647"));
        assertEquals(2, oneMore.code(), oneMore.out());
        assertTrue(oneMore.out().contains("2147483648 pages of 32 bytes; a pool's page index holds at most 2147483647 pages"),
                oneMore.out());
        Run memory = run(concat(shape, "--gpu-memory-gib", "1e90"));
        assertEquals(2, memory.code(), memory.out());
        assertTrue(memory.out().contains("over 2147483647 pages of 32 bytes"), memory.out());
        Run tiny = run(concat(shape, "--gpu-memory-gib", "0.00000001"));
        assertTrue(tiny.out().contains("0 pages of 32 bytes fit; the pool needs at least 2"), tiny.out());
    }

    /** A dimension that makes no model is a usage error naming its option, never a crash or a pool-size answer. */
    @Test
    void checkConfigRefusesDimensionsThatMakeNoModel() {
        String[] pool = {"--pool-tokens", "64", "--context", "16"};
        assertUsageError("--page-size must be in [1, 4096], not 0", concat(new String[] {"check-config", "--layers", "1", "--kv-heads", "1",
            "--head-dim", "8", "--page-size", "0"}, pool));
        assertUsageError("--page-size must be in [1, 4096], not 4097", concat(new String[] {"check-config", "--layers", "1", "--kv-heads",
            "1", "--head-dim", "8", "--page-size", "4097"}, pool));
        assertUsageError("--layers must be in [1, 4096], not 0 (a model of 0 layers has no KV bytes per token)",
                concat(new String[] {"check-config", "--layers", "0", "--kv-heads", "1", "--head-dim", "8"}, pool));
        assertUsageError("--kv-heads must be in [1, 2147483647], not 0", concat(new String[] {"check-config", "--layers", "1",
            "--kv-heads", "0", "--head-dim", "8"}, pool));
        assertUsageError("--head-dim must be in [1, 2147483647], not -8", concat(new String[] {"check-config", "--layers", "1",
            "--kv-heads", "1", "--head-dim", "-8"}, pool));
        assertUsageError("over the 2147483647-byte limit of a page buffer", concat(new String[] {"check-config", "--layers", "1",
            "--kv-heads", "1024", "--head-dim", "1024", "--page-size", "4096"}, pool));
        assertUsageError("--headroom must be in [0, 1) (the share of the pool kept free), not 1.0", concat(new String[] {"check-config",
            "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--headroom", "1.0"}, pool));
        assertUsageError("--headroom must be a decimal number within 100 digits of the point, not '1e-1000'", concat(new String[] {
            "check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--headroom", "1e-1000"}, pool));
    }

    private static String[] concat(String[] a, String... b) {
        String[] all = java.util.Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, all, a.length, b.length);
        return all;
    }

    @Test
    void usageErrorsNameTheBadValueAndListTheAllowedOnes() {
        assertUsageError("unknown preset 'gpt-9'; allowed: llama-3.1-8b", "check-config", "--preset", "gpt-9", "--pool-tokens", "10",
                "--context", "5");
        assertUsageError("unknown option '--colour'", "report", "--colour", "red");
        assertUsageError("unknown level 'paranoid'", "report", "--levels", "zero,paranoid");
        assertEquals(64, run("frobnicate").code());
    }
}
