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
        String[] args = ReportSchemaTest.tinyArgs(dir);
        String[] withCommand = new String[args.length + 1];
        withCommand[0] = "report";
        System.arraycopy(args, 0, withCommand, 1, args.length);
        Run r = run(withCommand);
        assertEquals(0, r.code(), r.err());
        for (String f : new String[] {"report.json", "report.md", "report.html", "throughput-ratio.png", "step-latency.png",
                "protection-bandwidth.png"}) {
            assertTrue(Files.size(dir.resolve(f)) > 100, f);
        }
        assertTrue(!r.out().contains("skipped"), "tenant-keys is on the class path, so nothing is skipped: " + r.out());
        assertTrue(r.err().contains("kvshield report:"), "a progress line: " + r.err());
        String html = Files.readString(dir.resolve("report.html"));
        assertTrue(html.contains("data:image/png;base64,"), "charts embedded");
        assertTrue(!html.contains("src=\"throughput"), "no external image references");
        String md = Files.readString(dir.resolve("report.md"));
        for (String level : new String[] {"stock", "none", "zero", "encrypt", "compliance"}) {
            assertTrue(md.contains("| " + level + " | ") && !md.contains("| " + level + " | skipped"), md);
        }
    }

    @Test
    void sweepRecommendsASettingPerLevel(@TempDir Path dir) throws IOException {
        String[] args = ReportSchemaTest.tinyArgs(dir, "--sweep", "--levels", "none,zero");
        String[] withCommand = new String[args.length + 1];
        withCommand[0] = "report";
        System.arraycopy(args, 0, withCommand, 1, args.length);
        Run r = run(withCommand);
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

    @Test
    void usageErrorsNameTheBadValueAndListTheAllowedOnes() {
        Run badPreset = run("check-config", "--preset", "gpt-9", "--pool-tokens", "10", "--context", "5");
        assertEquals(64, badPreset.code());
        assertTrue(badPreset.err().contains("unknown preset 'gpt-9'; allowed: llama-3.1-8b"), badPreset.err());
        Run badOption = run("report", "--colour", "red");
        assertEquals(64, badOption.code());
        assertTrue(badOption.err().contains("unknown option '--colour'"), badOption.err());
        Run badLevel = run("report", "--levels", "zero,paranoid");
        assertEquals(64, badLevel.code());
        assertTrue(badLevel.err().contains("unknown level 'paranoid'"), badLevel.err());
        assertEquals(64, run("frobnicate").code());
    }
}
