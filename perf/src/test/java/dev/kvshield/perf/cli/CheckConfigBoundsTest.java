package dev.kvshield.perf.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/**
 * check-config at its boundaries: a zero page size is a usage error naming it, a pool too large or a model of no
 * bytes is not reported as too few pages, and an exact fit with its headroom is OK. A crash is kept as the run's
 * {@code thrown}, so each test names it instead of dying with it.
 */
class CheckConfigBoundsTest {
    private record Run(int code, String out, String err, Throwable thrown) {}

    private static Run run(String... args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        try {
            int code = Main.run(args, new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(err, true, StandardCharsets.UTF_8));
            return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8), null);
        } catch (Throwable t) { // what Main.main lets escape: a stack trace and exit status 1
            return new Run(1, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8), t);
        }
    }

    /**
     * Promise (CheckConfigCommand: "Exit code 0 when it does, 2 (with both numbers) when it does not";
     * Main: a bad option is a usage error, 64, naming it). {@code --page-size 0} with {@code --pool-tokens}
     * divides by zero in CheckConfigCommand.run (tokens / pageSizeTokens) and dies with an
     * ArithmeticException stack trace instead of a usage error naming --page-size. Severity: low.
     */
    @Test
    void aZeroPageSizeIsAUsageErrorNamingIt() {
        Run r = run("check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "0", "--pool-tokens", "64",
                "--context", "16");
        assertEquals(null, r.thrown(), "check-config crashed: " + r.thrown());
        assertEquals(64, r.code(), r.out() + r.err());
        assertTrue(r.err().contains("page-size"), r.err());
    }

    /**
     * Promise (as above: "2 (with both numbers) when it does not"). A model of 0 layers (0 bytes per
     * token) with 1 GiB of KV memory answers "9223372036854775807 pages of 0 bytes fit; the pool needs
     * at least 2 (page 0 is reserved)": infinitely many pages are reported as too few (gib * 2^30 / 0
     * is +Infinity, cast to Long.MAX_VALUE, then caught by the pages > Integer.MAX_VALUE arm whose
     * message is the too-small one). Likewise {@code --pool-tokens 9223372036854775807} answers "576460752303423488 pages
     * ... the pool needs at least 2". The answer names the wrong problem at both ends. Severity: low.
     */
    @Test
    void aPoolTooLargeOrAModelOfNoBytesIsNotReportedAsTooFewPages() {
        Run zeroLayers = run("check-config", "--layers", "0", "--kv-heads", "1", "--head-dim", "8", "--gpu-memory-gib", "1", "--context", "16");
        assertEquals(null, zeroLayers.thrown());
        assertFalse(zeroLayers.out().contains("needs at least 2"), "0 bytes per token reported as too few pages: " + zeroLayers.out());
        Run huge = run("check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--pool-tokens", "9223372036854775807",
                "--context", "16");
        assertEquals(null, huge.thrown());
        assertFalse(huge.out().contains("needs at least 2"), "an oversized pool reported as too few pages: " + huge.out());
    }

    /**
     * Promise (CheckConfigCommand: "does a pool of this model geometry and size hold one advertised
     * max-length request with the configured headroom?", exit 0 when it does; the NOT OK line's
     * "Needed: N pages" is the size that would). 90 token slots with 0.3 kept free leave exactly 63 for
     * one request, but AdmissionLimits.compute floors 90 * (1.0 - 0.3) = 62.99999999999999 to 62, so
     * check-config answers "NOT OK ... pool holds 62" and then recommends "Needed: 91 pages", the 91
     * pages the pool already has (page 0 included). The same floor is the pool's admission arithmetic, so a
     * server sized this way admits only 62-token requests while advertising 63. Likewise 100 slots at
     * 0.9 headroom hold 9, not 10. Severity: low (an exact fit is refused, with a self-contradicting advice).
     */
    @Test
    void anExactFitWithHeadroomIsOk() {
        Run r = run("check-config", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "1", "--pool-tokens", "90",
                "--context", "63", "--headroom", "0.3");
        assertEquals(null, r.thrown());
        assertEquals(0, r.code(), "90 slots less 30% headroom hold exactly 63 tokens: " + r.out());
    }
}
