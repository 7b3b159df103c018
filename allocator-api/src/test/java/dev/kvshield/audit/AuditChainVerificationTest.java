package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The verifier against an untouched trail and against each kind of tampering, each failing with
 * the right first bad sequence number.
 */
class AuditChainVerificationTest {
    private static final AuditKeys.SigningKey KEY = AuditKeys.generateInMemory();
    private static final AuditKeys.SigningKey OTHER_KEY = AuditKeys.generateInMemory();
    @TempDir
    static Path shared;
    private static Path original;

    @TempDir
    Path work;

    @BeforeAll
    static void writeTrail() throws IOException {
        original = shared.resolve("trail");
        AuditFixtures.closedTrail(original, KEY, 24);
    }

    private Path copy() throws IOException {
        Path dir = work.resolve("copy");
        AuditFixtures.copyTree(original, dir);
        return dir;
    }

    private static AuditVerifier.Report verify(Path dir) throws IOException {
        return AuditVerifier.verify(List.of(dir), KEY.publicKey());
    }

    private static void assertFirstBad(long seq, AuditVerifier.Report r) {
        assertFalse(r.ok(), "tampering must be detected");
        assertEquals(seq, r.firstBadSeq(), () -> "first bad seq; problems: " + r.problems());
    }

    @Test
    void untouchedTrailVerifiesAcrossRotatedFiles() throws IOException {
        assertTrue(AuditFixtures.files(original).size() >= 3, "the scenario must rotate across files");
        AuditVerifier.Report r = verify(original);
        assertTrue(r.ok(), () -> r.problems().toString());
        assertEquals(-1, r.firstBadSeq());
        assertTrue(r.checkpoints() >= 3, "periodic checkpoints plus the final one: " + r.checkpoints());
        long mono = Long.MIN_VALUE;
        for (AuditLog.Line l : AuditLog.read(List.of(original))) {
            long m = l.number("mono", -1);
            assertTrue(m >= mono, () -> "monotonic time goes back at seq " + l.number("seq", -1));
            mono = m;
        }
    }

    @Test
    void flippedByteAnywhereInARecordIsChargedToThatRecord() throws IOException {
        long seq = 57;
        long rngSeed = 0x5EEDL;
        SplittableRandom rng = new SplittableRandom(rngSeed);
        for (int trial = 0; trial < 12; trial++) {
            Path dir = work.resolve("flip" + trial);
            AuditFixtures.copyTree(original, dir);
            AuditFixtures.Location at = AuditFixtures.locate(dir, seq);
            List<String> lines = new ArrayList<>(Files.readAllLines(at.file(), StandardCharsets.UTF_8));
            String line = lines.get(at.index());
            int pos = rng.nextInt(line.length());
            char c = line.charAt(pos);
            char flipped = (char) (c ^ (1 << rng.nextInt(5)));
            if (flipped < 0x20 || flipped == c) {
                flipped = c == 'a' ? 'b' : 'a';
            }
            lines.set(at.index(), line.substring(0, pos) + flipped + line.substring(pos + 1));
            AuditFixtures.rewrite(at.file(), lines);
            int p = pos;
            AuditVerifier.Report r = verify(dir);
            assertFalse(r.ok(), () -> "seed " + rngSeed + ": flip at " + p + " undetected");
            assertEquals(seq, r.firstBadSeq(), () -> "seed " + rngSeed + " flip at offset " + p + ": " + r.problems());
        }
    }

    @Test
    void removedRecordIsReportedAsMissing() throws IOException {
        Path dir = copy();
        AuditFixtures.Location at = AuditFixtures.locate(dir, 40);
        List<String> lines = new ArrayList<>(Files.readAllLines(at.file()));
        lines.remove(at.index());
        AuditFixtures.rewrite(at.file(), lines);
        assertFirstBad(40, verify(dir));
    }

    @Test
    void reorderedPairIsChargedToTheFirstPosition() throws IOException {
        Path dir = copy();
        AuditFixtures.Location at = AuditFixtures.locate(dir, 30);
        List<String> lines = new ArrayList<>(Files.readAllLines(at.file()));
        if (at.index() + 1 >= lines.size()) {
            at = AuditFixtures.locate(dir, 31);
            lines = new ArrayList<>(Files.readAllLines(at.file()));
        }
        long first = Long.parseLong(lines.get(at.index()).replaceAll("^\\{\"seq\":(\\d+),.*", "$1"));
        Collections.swap(lines, at.index(), at.index() + 1);
        AuditFixtures.rewrite(at.file(), lines);
        assertFirstBad(first, verify(dir));
    }

    @Test
    void truncatedTailIsDetected() throws IOException {
        Path dir = copy();
        List<Path> files = AuditFixtures.files(dir);
        Path last = files.getLast();
        List<String> lines = new ArrayList<>(Files.readAllLines(last));
        if (lines.size() < 4) {
            Files.delete(last);
            last = files.get(files.size() - 2);
            lines = new ArrayList<>(Files.readAllLines(last));
        }
        List<String> kept = lines.subList(0, lines.size() - 3);
        long lastKept = Long.parseLong(kept.getLast().replaceAll("^\\{\"seq\":(\\d+),.*", "$1"));
        AuditFixtures.rewrite(last, kept);
        assertFirstBad(lastKept + 1, verify(dir));
    }

    @Test
    void shippedCheckpointsCatchATailCutBackToAnEarlierCheckpoint() throws IOException {
        Path dir = work.resolve("shipping");
        Path shipped = work.resolve("shipped.jsonl");
        AuditFixtures.closedTrail(dir, KEY, 12, shipped);
        List<String> shippedLines = Files.readAllLines(shipped);
        assertTrue(shippedLines.size() >= 2);
        assertTrue(AuditVerifier.verify(List.of(dir), KEY.publicKey(), shippedLines).ok(), "untouched log holds every shipped checkpoint");
        // Delete the last rotated file (it holds the final checkpoint): the tail check fires, and the
        // shipped copies name the checkpoints that went missing.
        Path last = AuditFixtures.files(dir).getLast();
        Files.delete(last);
        AuditVerifier.Report r = AuditVerifier.verify(List.of(dir), KEY.publicKey(), shippedLines);
        assertFalse(r.ok());
        assertTrue(r.problems().stream().anyMatch(p -> p.startsWith("shipped checkpoint seq")), r.problems().toString());
    }

    @Test
    void truncatedHeadIsDetected() throws IOException {
        Path dir = copy();
        Path first = AuditFixtures.files(dir).getFirst();
        List<String> lines = new ArrayList<>(Files.readAllLines(first));
        AuditFixtures.rewrite(first, lines.subList(3, lines.size()));
        assertFirstBad(0, verify(dir));
    }

    @Test
    void removedWholeRotatedFileIsDetected() throws IOException {
        Path dir = copy();
        Path middle = AuditFixtures.files(dir).get(1);
        long firstOfMiddle = Long.parseLong(Files.readAllLines(middle).getFirst().replaceAll("^\\{\"seq\":(\\d+),.*", "$1"));
        Files.delete(middle);
        assertFirstBad(firstOfMiddle, verify(dir));
    }

    @Test
    void checkpointsSignedByAnotherKeyFail() throws IOException {
        Path forged = work.resolve("forged");
        // A host rewriting its whole log can rebuild the hash chain, but not sign with the pinned key.
        AuditFixtures.closedTrail(forged, OTHER_KEY, 24);
        long firstCheckpoint = -1;
        for (AuditLog.Line l : AuditLog.read(List.of(forged))) {
            if (l.type().equals("checkpoint")) {
                firstCheckpoint = l.number("seq", -1);
                break;
            }
        }
        AuditVerifier.Report r = verify(forged);
        assertFirstBad(firstCheckpoint, r);
        assertTrue(r.problems().getFirst().contains(AuditKeys.fingerprint(KEY.publicKey())), r.problems().getFirst());
        assertTrue(AuditVerifier.verify(List.of(forged), OTHER_KEY.publicKey()).ok(), "the twin: the signer's own key verifies it");
    }

    @Test
    void cliExitsTwoOnTamperingAndOnAFileThatIsNoAuditLog() throws IOException {
        Path pub = work.resolve("keys");
        String fingerprint = AuditKeys.generate(pub);
        assertEquals(32, fingerprint.length());
        Path dir = work.resolve("cli");
        AuditFixtures.closedTrail(dir, AuditKeys.loadSigningKey(pub.resolve(AuditKeys.PRIVATE_FILE)), 6);
        String pubFile = pub.resolve(AuditKeys.PUBLIC_FILE).toString();
        assertEquals(0, run("verify", "--pubkey", pubFile, dir.toString()));
        Path junk = work.resolve("notes.jsonl");
        Files.writeString(junk, "{\"hello\":\"world\"}\nplain text\n");
        assertEquals(2, run("verify", "--pubkey", pubFile, junk.toString()));
        Path empty = work.resolve("empty.jsonl");
        Files.writeString(empty, "");
        assertEquals(2, run("verify", "--pubkey", pubFile, empty.toString()));
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        AuditFixtures.Location at = AuditFixtures.locate(dir, 5);
        List<String> lines = new ArrayList<>(Files.readAllLines(at.file()));
        lines.set(at.index(), lines.get(at.index()).replace("\"tenant\":0", "\"tenant\":1"));
        AuditFixtures.rewrite(at.file(), lines);
        assertEquals(2, AuditTool.run(new String[] {"verify", "--json", "--pubkey", pubFile, dir.toString()},
                new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(new ByteArrayOutputStream())));
        var doc = dev.kvshield.audit.internal.Json.parseObject(out.toString(StandardCharsets.UTF_8).strip());
        assertEquals(Boolean.FALSE, doc.get("ok"));
        assertEquals(5L, doc.get("firstBadSeq"));
    }

    private static int run(String... args) {
        return AuditTool.run(args, new PrintStream(new ByteArrayOutputStream()), new PrintStream(new ByteArrayOutputStream()));
    }
}
