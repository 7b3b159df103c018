package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The audit command line on a trail with one hostile line (a record-looking line nesting 200,000 arrays): verify
 * names it as not an audit record and exposure counts it as unparsed and still reports, neither crashing. A crash is
 * kept as the run's {@code thrown}, so each test names it instead of dying with it.
 */
class AuditToolHostileLinesTest {
    @TempDir
    Path dir;

    private record Result(int status, String out, String err, Throwable thrown) {}

    /** Runs {@code ./kvshield audit ARGS} as the launcher does; a throwable escaping {@link AuditTool#run} is kept, not rethrown. */
    private static Result run(String... args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int status;
        Throwable thrown = null;
        try {
            status = AuditTool.run(args, new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(err, true, StandardCharsets.UTF_8));
        } catch (Throwable t) { // what AuditTool.main would let escape: the JVM prints a stack trace and exits 1
            thrown = t;
            status = 1;
        }
        return new Result(status, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8), thrown);
    }

    /**
     * A line that looks like a record (it ends in a well-placed {@code ,"hash":"<64 hex>"}) but nests
     * {@code depth} arrays inside it: a tampered or corrupted line, a few MB long.
     */
    private static String deeplyNestedLine(int depth) {
        StringBuilder sb = new StringBuilder(2 * depth + 200);
        sb.append("{\"seq\":3,\"type\":\"read\",\"pages\":");
        sb.append("[".repeat(depth)).append("]".repeat(depth));
        sb.append(",\"hash\":\"").append("0".repeat(64)).append("\"}");
        return sb.toString();
    }

    private Path trailWithOneHostileLine(AuditKeys.SigningKey key) throws IOException {
        Path trail = dir.resolve("trail");
        AuditFixtures.closedTrail(trail, key, 4);
        List<Path> files = AuditFixtures.files(trail);
        Files.writeString(files.getLast(), deeplyNestedLine(200_000) + "\n", StandardCharsets.UTF_8, StandardOpenOption.APPEND);
        return trail;
    }

    /**
     * Promise (README: {@code audit verify} exits "0 only when all is well, 2 naming each problem";
     * AuditTool: "Exit status ... 2 when a verification fails"; AuditLog.read: a line that is not a
     * well-formed record is kept "so verify names the broken record"). One appended line of 400,000
     * brackets (any writer of the directory can add it) makes the parser (Json.Parser.value, recursive,
     * no depth limit) throw StackOverflowError out of AuditLog.parse, which catches only
     * IllegalArgumentException: verify dies with a stack trace and exit status 1 ("usage error"), naming
     * nothing, instead of "FAILED ... not an audit record" and 2. Severity: medium (an operator's or a
     * CI gate's verification of a tampered trail crashes rather than reporting the tampering; a gate that
     * treats 1 as "misconfigured, skip" passes the trail).
     */
    @Test
    void verifyNamesADeeplyNestedLineInsteadOfCrashing() throws IOException {
        Path keys = dir.resolve("keys");
        AuditKeys.generate(keys);
        Path trail = trailWithOneHostileLine(AuditKeys.loadSigningKey(keys.resolve(AuditKeys.PRIVATE_FILE)));
        Path pub = keys.resolve(AuditKeys.PUBLIC_FILE);
        Result r = run("verify", "--pubkey", pub.toString(), trail.toString());
        assertEquals(null, r.thrown(), "verify crashed on one hostile line: " + r.thrown());
        assertEquals(2, r.status(), r.out() + r.err());
        assertTrue(r.out().startsWith("FAILED") && r.out().contains("not an audit record"), r.out());
    }

    /**
     * Promise (AuditTool/ExposureQuery: lines that are not readable records are counted,
     * {@code unparsedLines}, and the tool says "run 'audit verify'"; the exposure report still comes
     * out). The same hostile line makes {@code audit exposure} crash with StackOverflowError before it
     * reports anything: one corrupted line hides every exposure and every blocked attempt of the trail.
     * Severity: medium (the forensic query is defeated by one line).
     */
    @Test
    void exposureCountsADeeplyNestedLineAsUnparsedAndStillReports() throws IOException {
        Path trail = trailWithOneHostileLine(AuditKeys.generateInMemory());
        Result r = run("exposure", "--json", trail.toString());
        assertEquals(null, r.thrown(), "exposure crashed on one hostile line: " + r.thrown());
        assertEquals(0, r.status(), r.err());
        assertTrue(r.out().contains("\"unparsedLines\":1"), r.out());
    }
}
