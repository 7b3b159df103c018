package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Pins the on-disk format (format 2): the golden scenario ({@link GoldenTrail}) must produce exactly
 * the bytes of {@code golden-trail.jsonl}, split into files of exactly the pinned sizes. Any change
 * to a field, its order, escaping, UTF-8 encoding, how events group into records, the hashed or
 * signed bytes or rotation fails it; trails verify across versions only while it passes.
 * ({@code golden-trail-v1.jsonl} is the format-1 trail the verifier now refuses.)
 */
class AuditRecordFormatTest {
    /** Byte sizes of the rotated files of the golden trail, in order. */
    private static final long[] FILE_BYTES = {1847, 1737, 1841, 1956, 1841, 1725, 1853, 1998, 1772, 1898, 559};

    @TempDir
    Path dir;

    private static byte[] golden() throws IOException {
        try (InputStream in = AuditRecordFormatTest.class.getResourceAsStream("golden-trail.jsonl")) {
            return in.readAllBytes();
        }
    }

    /** Asserts that {@code trail} holds exactly the golden bytes in files of the golden sizes. */
    private static void assertGoldenFiles(Path trail) throws IOException {
        List<Path> files = AuditFixtures.files(trail);
        ByteArrayOutputStream all = new ByteArrayOutputStream();
        long[] sizes = new long[files.size()];
        for (int i = 0; i < sizes.length; i++) {
            byte[] b = Files.readAllBytes(files.get(i));
            sizes[i] = b.length;
            all.write(b);
        }
        byte[] expected = golden();
        byte[] actual = all.toByteArray();
        if (!Arrays.equals(expected, actual)) {
            Path out = Path.of("target", "golden-trail.actual.jsonl");
            Files.write(out, actual);
            assertEquals(new String(expected, StandardCharsets.UTF_8), new String(actual, StandardCharsets.UTF_8),
                    "record bytes differ from the golden trail; the actual bytes are in " + out.toAbsolutePath());
        }
        assertArrayEquals(FILE_BYTES, sizes, () -> "rotated file sizes " + Arrays.toString(sizes));
    }

    @Test
    void goldenScenarioWritesExactlyThePinnedBytes() throws IOException {
        AuditKeys.SigningKey key = GoldenTrail.key(dir);
        Path trail = dir.resolve("trail");
        GoldenTrail.write(AuditSink.rotatingFiles(trail, "audit", GoldenTrail.MAX_FILE_BYTES), key);
        assertGoldenFiles(trail);
        AuditVerifier.Report r = AuditVerifier.verify(List.of(trail), key.publicKey());
        assertTrue(r.ok(), () -> r.problems().toString());
    }

    @Test
    void sinksTakingLinesAsStringsGetAndWriteTheSameRecords() throws IOException {
        List<String> lines = new ArrayList<>();
        GoldenTrail.write(new AuditSink() {
            @Override
            public void append(List<String> batch) {
                lines.addAll(batch);
            }

            @Override
            public void sync() { }

            @Override
            public String describe() {
                return "list";
            }

            @Override
            public void close() { }
        }, GoldenTrail.key(dir));
        assertEquals(new String(golden(), StandardCharsets.UTF_8), String.join("\n", lines) + "\n");
        Path trail = dir.resolve("from-strings");
        try (AuditSink files = AuditSink.rotatingFiles(trail, "audit", GoldenTrail.MAX_FILE_BYTES)) {
            files.append(lines);
        }
        assertGoldenFiles(trail);
    }
}
