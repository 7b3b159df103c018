package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.internal.RecordChain;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Issue 15, attacked: a host without the signing key cuts its trail, re-marks a checkpoint as the
 * final one (recomputing the record's hash, which needs no key), drops the last checkpoint, swaps
 * or reorders rotated files, splices two boots' trails, or replays an older boot's complete trail.
 * The verifier refuses each (exit 2) with a message naming what is wrong, and accepts the untouched
 * trail. Every attack that one check alone stops has a planted twin: the verifier without that
 * check must accept the attacked trail, which shows the attack trail is perfect in every other
 * respect and that the assertion sees the check.
 */
class AuditSealTest {
    private static final AuditKeys.SigningKey KEY = AuditKeys.generateInMemory();
    private static final int ROUNDS = 10;
    @TempDir
    static Path shared;
    /** Boot A, then boot B, of the same pool and rank, shipping their checkpoints to one file. */
    private static Path bootA;
    private static Path bootB;
    private static Path shipped;

    @TempDir
    Path work;

    @BeforeAll
    static void writeTwoBoots() throws IOException {
        bootA = shared.resolve("boot-a");
        bootB = shared.resolve("boot-b");
        shipped = shared.resolve("shipped.jsonl");
        AuditFixtures.closedTrail(bootA, KEY, ROUNDS, shipped);
        AuditFixtures.closedTrail(bootB, KEY, ROUNDS, shipped);
    }

    private static AuditVerifier.Report verify(Path dir) throws IOException {
        return AuditVerifier.verify(List.of(dir), KEY.publicKey());
    }

    /** {@code ./kvshield audit verify} on {@code dir}: the exit status and what it printed. */
    private record Cli(int status, String out) {}

    private Cli cli(String... args) throws IOException {
        Path pub = work.resolve("pinned.pub");
        if (!Files.exists(pub)) {
            Files.writeString(pub, "-----BEGIN PUBLIC KEY-----\n"
                    + java.util.Base64.getMimeEncoder().encodeToString(KEY.publicKey().getEncoded()) + "\n-----END PUBLIC KEY-----\n");
        }
        List<String> all = new ArrayList<>(List.of("verify", "--pubkey", pub.toString()));
        all.addAll(List.of(args));
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        int status = AuditTool.run(all.toArray(String[]::new), new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(out, true, StandardCharsets.UTF_8));
        return new Cli(status, out.toString(StandardCharsets.UTF_8));
    }

    private static String trailId(Path dir) throws IOException {
        String id = AuditLog.read(List.of(dir)).getFirst().string("trail");
        assertTrue(id != null && id.matches("[0-9a-f]{32}"), "the opening record names a 128-bit trail id: " + id);
        return id;
    }

    /** The records of a trail as (file, lines) in chain order. */
    private record TrailFile(String name, List<String> lines) {}

    private static List<TrailFile> read(Path dir) throws IOException {
        List<TrailFile> files = new ArrayList<>();
        for (Path f : AuditFixtures.files(dir)) {
            files.add(new TrailFile(f.getFileName().toString(), Files.readAllLines(f, StandardCharsets.UTF_8)));
        }
        return files;
    }

    private static void write(Path dir, List<TrailFile> files) throws IOException {
        Files.createDirectories(dir);
        for (TrailFile f : files) {
            Files.write(dir.resolve(f.name()), f.lines(), StandardCharsets.UTF_8);
        }
    }

    /** The first {@code keep} records of {@code files}, cut as a host truncating its log would: later files removed. */
    private static List<TrailFile> cut(List<TrailFile> files, int keep) {
        List<TrailFile> out = new ArrayList<>();
        int left = keep;
        for (TrailFile f : files) {
            if (left == 0) {
                break;
            }
            int n = Math.min(left, f.lines().size());
            out.add(new TrailFile(f.name(), List.copyOf(f.lines().subList(0, n))));
            left -= n;
        }
        return out;
    }

    /** Replaces the last line of the trail with {@code line}. */
    private static List<TrailFile> withLastLine(List<TrailFile> files, String line) {
        List<TrailFile> out = new ArrayList<>(files);
        TrailFile last = out.getLast();
        List<String> lines = new ArrayList<>(last.lines());
        lines.set(lines.size() - 1, line);
        out.set(out.size() - 1, new TrailFile(last.name(), lines));
        return out;
    }

    /** {@code line} with one literal replaced and its hash recomputed, as anyone can without the key. */
    private static String rehashed(String line, String from, String to) {
        String body = RecordChain.bodyOf(line);
        assertTrue(body != null && body.contains(from), () -> "no " + from + " in " + line);
        String changed = body.replace(from, to);
        return changed + RecordChain.HASH_FIELD + RecordChain.hashOf(RecordChain.sha256(), changed) + "\"}";
    }

    private static boolean isCheckpoint(String line) {
        return line.contains("\"type\":\"checkpoint\"");
    }

    private static List<String> lines(List<TrailFile> files) {
        return files.stream().flatMap(f -> f.lines().stream()).toList();
    }

    private static void assertRefused(AuditVerifier.Report r, long firstBad, String... named) {
        assertFalse(r.ok(), "the attack must be refused");
        assertEquals(firstBad, r.firstBadSeq(), r.problems()::toString);
        for (String n : named) {
            assertTrue(r.problems().stream().anyMatch(p -> p.contains(n)), () -> "no problem names '" + n + "': " + r.problems());
        }
    }

    @Test
    void untouchedBootsVerify() throws IOException {
        for (Path boot : List.of(bootA, bootB)) {
            AuditVerifier.Report r = verify(boot);
            assertTrue(r.ok(), r.problems()::toString);
            assertTrue(r.checkpoints() >= 3, "periodic checkpoints and the final one: " + r.checkpoints());
            Cli c = cli(boot.toString());
            assertEquals(0, c.status(), c.out());
            assertTrue(c.out().contains("trail " + trailId(boot)), "the verdict names the trail it verified: " + c.out());
        }
        assertFalse(trailId(bootA).equals(trailId(bootB)), "every boot mints its own trail id");
    }

    @Test
    void aTrailCutAtAnyRecordIsRefusedAndSoIsACutCheckpointReMarkedFinal() throws IOException {
        List<TrailFile> files = read(bootA);
        List<String> all = lines(files);
        int remarked = 0;
        for (int keep = 1; keep < all.size(); keep++) {
            List<TrailFile> cutFiles = cut(files, keep);
            Path dir = work.resolve("cut-" + keep);
            write(dir, cutFiles);
            assertRefused(verify(dir), keep, "not sealed");
            String last = all.get(keep - 1);
            if (isCheckpoint(last) && last.contains("\"final\":false")) {
                Path re = work.resolve("remarked-" + keep);
                write(re, withLastLine(cutFiles, rehashed(last, "\"final\":false", "\"final\":true")));
                AuditVerifier.Report r = verify(re);
                assertRefused(r, keep - 1, "checkpoint seq " + (keep - 1), "signature");
                Cli c = cli(re.toString());
                assertEquals(2, c.status(), c.out());
                assertTrue(c.out().contains("checkpoint seq " + (keep - 1)) && c.out().contains("signature"), c.out());
                // Twin: a verifier without the signature check accepts the re-marked cut, so this trail is sealed,
                // chained and sequenced like a closed one and only the signature over its final flag tells.
                assertTrue(AuditVerifier.verifySkipping(List.of(re), KEY.publicKey(), AuditVerifier.Check.SIGNATURE).ok(),
                        "planted: a verifier that does not check signatures accepts the re-marked cut");
                remarked++;
            }
            if (isCheckpoint(last)) {
                // Twin: without the seal check, a cut right after a checkpoint passes.
                assertTrue(AuditVerifier.verifySkipping(List.of(dir), KEY.publicKey(), AuditVerifier.Check.SEAL).ok(),
                        "planted: a verifier that does not demand a final checkpoint accepts a cut after checkpoint " + (keep - 1));
            }
        }
        assertTrue(remarked >= 2, "the trail has periodic checkpoints to re-mark: " + remarked);
    }

    @Test
    void theFinalCheckpointUnmarkedOrDroppedIsRefused() throws IOException {
        List<TrailFile> files = read(bootA);
        List<String> all = lines(files);
        String last = all.getLast();
        long lastSeq = all.size() - 1;
        Path unmarked = work.resolve("unmarked");
        write(unmarked, withLastLine(files, rehashed(last, "\"final\":true", "\"final\":false")));
        assertRefused(verify(unmarked), lastSeq, "checkpoint seq " + lastSeq, "signature");
        Path dropped = work.resolve("dropped");
        write(dropped, cut(files, all.size() - 1));
        assertRefused(verify(dropped), lastSeq, "not sealed");
        assertEquals(2, cli(dropped.toString()).status());
    }

    @Test
    void swappedOrReorderedRotatedFilesAreRefused() throws IOException {
        List<TrailFile> files = read(bootA);
        assertTrue(files.size() >= 4, "the trail rotates: " + files.size());
        long firstOfSecond = files.getFirst().lines().size();
        // Swap the contents of files 2 and 3 (names kept): the chain reads them out of order.
        List<TrailFile> swapped = new ArrayList<>(files);
        swapped.set(1, new TrailFile(files.get(1).name(), files.get(2).lines()));
        swapped.set(2, new TrailFile(files.get(2).name(), files.get(1).lines()));
        Path dir = work.resolve("swapped");
        write(dir, swapped);
        assertRefused(verify(dir), firstOfSecond, "missing");
        // Twin: each record and checkpoint is intact, so only the chain check sees the order.
        assertTrue(AuditVerifier.verifySkipping(List.of(dir), KEY.publicKey(), AuditVerifier.Check.CHAIN).ok(),
                "planted: a verifier that does not follow the chain accepts swapped files");
        // Listing the files in another order on the command line reads them in that order.
        Path cli = work.resolve("listed");
        write(cli, files);
        List<String> args = new ArrayList<>();
        for (int i = files.size() - 1; i >= 0; i--) {
            args.add(cli.resolve(files.get(i).name()).toString());
        }
        Cli c = cli(args.toArray(String[]::new));
        assertEquals(2, c.status(), c.out());
    }

    @Test
    void aTrailSplicedFromTwoBootsIsRefusedNamingBothTrails() throws IOException {
        List<TrailFile> a = read(bootA);
        List<TrailFile> b = read(bootB);
        String idA = trailId(bootA);
        String idB = trailId(bootB);
        // Boot A's first two files, then boot B's from the third on.
        List<TrailFile> spliced = new ArrayList<>(a.subList(0, 2));
        spliced.addAll(b.subList(2, b.size()));
        Path dir = work.resolve("spliced");
        write(dir, spliced);
        long firstOfB = a.get(0).lines().size() + a.get(1).lines().size();
        assertRefused(verify(dir), firstOfB, idA, idB);
        // Twin: the chain alone refuses the splice too, but only the trail check says it is two boots.
        assertTrue(AuditVerifier.verifySkipping(List.of(dir), KEY.publicKey(), AuditVerifier.Check.TRAIL).problems().stream()
                .noneMatch(p -> p.contains(idB)), "planted: without the trail check no problem names boot B's trail");
        // One of boot B's files in place of boot A's second.
        List<TrailFile> swapped = new ArrayList<>(a);
        swapped.set(1, new TrailFile(a.get(1).name(), b.get(1).lines()));
        Path one = work.resolve("one-file");
        write(one, swapped);
        assertRefused(verify(one), a.get(0).lines().size(), idA, idB);
        // Both boots in one directory (two prefixes): two trails, not one.
        Path both = work.resolve("both");
        write(both, a);
        for (TrailFile f : b) {
            Files.write(both.resolve("z-" + f.name()), f.lines(), StandardCharsets.UTF_8);
        }
        assertRefused(verify(both), lines(a).size(), idA, idB);
    }

    @Test
    void anOlderBootReplayedInPlaceOfTheCurrentOneIsRefusedByTheShippedCheckpoints() throws IOException {
        String idA = trailId(bootA);
        String idB = trailId(bootB);
        // The current boot (B) verifies against a shipped file that also holds the older boot's checkpoints.
        Cli current = cli("--shipped", shipped.toString(), bootB.toString());
        assertEquals(0, current.status(), current.out());
        // Boot A's complete, sealed trail where boot B's should be.
        Cli replayed = cli("--shipped", shipped.toString(), bootA.toString());
        assertEquals(2, replayed.status(), replayed.out());
        assertTrue(replayed.out().contains(idB) && replayed.out().contains("newer"), replayed.out());
        // Twin: boot A's trail is perfect in itself; only the shipped checkpoints tell it is not the current one.
        List<String> shippedLines = Files.readAllLines(shipped);
        assertTrue(AuditVerifier.verifySkipping(List.of(bootA), KEY.publicKey(), AuditVerifier.Check.SHIPPED, shippedLines, null).ok(),
                "planted: a verifier that ignores the shipped checkpoints accepts the older boot");
        // Verifying the older trail on purpose names it.
        assertEquals(0, cli("--shipped", shipped.toString(), "--trail", idA, bootA.toString()).status());
        Cli wrong = cli("--trail", idB, bootA.toString());
        assertEquals(2, wrong.status(), wrong.out());
        assertTrue(wrong.out().contains(idA) && wrong.out().contains(idB), wrong.out());
        // Twin: without the trail check, the expected-trail mismatch goes unseen.
        assertTrue(AuditVerifier.verifySkipping(List.of(bootA), KEY.publicKey(), AuditVerifier.Check.TRAIL, List.of(), idB).ok(),
                "planted: a verifier that does not compare trail ids accepts boot A as boot B");
    }

    @Test
    void aFormatOneTrailIsRefusedBecauseItsCheckpointsDoNotSignTheFinalFlag() throws IOException {
        Path dir = work.resolve("v1");
        Files.createDirectories(dir);
        try (var in = AuditSealTest.class.getResourceAsStream("golden-trail-v1.jsonl")) {
            Files.write(dir.resolve("audit-000001.jsonl"), in.readAllBytes());
        }
        AuditVerifier.Report r = AuditVerifier.verify(List.of(dir), GoldenTrail.key(work).publicKey());
        assertRefused(r, 0, "format 1");
    }
}
