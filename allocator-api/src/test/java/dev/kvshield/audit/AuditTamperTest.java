package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A trail written by the byte encoder verifies, and changing any character (so any byte) of a
 * record — its escaped non-ASCII tenant name, a signed checkpoint — fails verification at that
 * record; a sink writing other bytes than were hashed fails it too.
 */
class AuditTamperTest {
    /**
     * The tenant record with the escaped non-ASCII name and the first (signed) checkpoint; event
     * records are covered by {@link AuditChainVerificationTest}'s random flips. Every character
     * costs a verification, so two records keep this test at a few seconds.
     */
    private static final long[] TAMPERED_SEQS = {1, 16};
    /**
     * The flips are verified on the trail's records up to its first checkpoint (seq 16): one
     * Ed25519 check per flip instead of one per checkpoint of the whole trail (milliseconds each).
     */
    private static final long PREFIX_END = 16;

    @TempDir
    Path dir;

    private AuditKeys.SigningKey writeGolden(AuditSink sink) throws IOException {
        AuditKeys.SigningKey key = GoldenTrail.key(dir);
        GoldenTrail.write(sink, key);
        return key;
    }

    @Test
    void everyCharacterOfARecordIsProtected() throws IOException {
        Path trail = dir.resolve("trail");
        AuditKeys.SigningKey key = writeGolden(AuditSink.rotatingFiles(trail, "audit", GoldenTrail.MAX_FILE_BYTES));
        assertTrue(AuditVerifier.verify(List.of(trail), key.publicKey()).ok(), "the untouched trail verifies");
        Path prefix = prefix(trail, dir.resolve("prefix"));
        for (long seq : TAMPERED_SEQS) {
            AuditFixtures.Location at = AuditFixtures.locate(prefix, seq);
            List<String> lines = Files.readAllLines(at.file(), StandardCharsets.UTF_8);
            String line = lines.get(at.index());
            for (int pos = 0; pos < line.length(); pos += Character.charCount(line.codePointAt(pos))) {
                int c = line.codePointAt(pos);
                // A character for a character (never half a surrogate pair) keeps the file valid UTF-8.
                int other = c >= 0x80 ? (c == 'é' ? 'ß' : 'é') : (c == 'a' ? 'b' : 'a');
                String changed = line.substring(0, pos) + Character.toString(other) + line.substring(pos + Character.charCount(c));
                AuditVerifier.Report r = verifyWith(prefix, at, lines, changed, key);
                int p = pos;
                assertFalse(r.ok(), () -> "seq " + seq + ": " + Character.toString(other) + " for " + Character.toString(c) + " at "
                        + p + " undetected");
                assertEquals(seq, r.firstBadSeq(), () -> "seq " + seq + " changed at " + p + ": " + r.problems());
            }
            // The twin: the same rewrite with the line as it was leaves only the prefix's open tail, or the
            // detections above prove nothing.
            AuditVerifier.Report untouched = verifyWith(prefix, at, lines, line, key);
            assertEquals(PREFIX_END + 1, untouched.firstBadSeq(), untouched.problems()::toString);
            assertEquals(1, untouched.problems().size(), untouched.problems()::toString);
            assertTrue(untouched.problems().getFirst().startsWith("tail is not sealed"), untouched.problems()::toString);
        }
    }

    /** Copies {@code trail}'s records 0..{@link #PREFIX_END} into {@code to}, in files as they were. */
    private static Path prefix(Path trail, Path to) throws IOException {
        Files.createDirectories(to);
        long seq = 0;
        for (Path f : AuditFixtures.files(trail)) {
            List<String> kept = new ArrayList<>();
            for (String l : Files.readAllLines(f, StandardCharsets.UTF_8)) {
                if (seq++ <= PREFIX_END) {
                    kept.add(l);
                }
            }
            if (!kept.isEmpty()) {
                Files.write(to.resolve(f.getFileName()), kept, StandardCharsets.UTF_8);
            }
        }
        return to;
    }

    /** Verifies the trail with line {@code at} replaced by {@code replacement}, then restores the file. */
    private static AuditVerifier.Report verifyWith(Path trail, AuditFixtures.Location at, List<String> lines, String replacement,
            AuditKeys.SigningKey key) throws IOException {
        List<String> changed = new ArrayList<>(lines);
        changed.set(at.index(), replacement);
        AuditFixtures.rewrite(at.file(), changed);
        try {
            return AuditVerifier.verify(List.of(trail), key.publicKey());
        } finally {
            AuditFixtures.rewrite(at.file(), lines);
        }
    }

    @Test
    void plantedSinkThatWritesOtherBytesThanWereHashedFailsVerification() throws IOException {
        Path trail = dir.resolve("planted");
        long seq = 23;
        AuditKeys.SigningKey key = writeGolden(
                new FlipOneByteSink(AuditSink.rotatingFiles(trail, "audit", GoldenTrail.MAX_FILE_BYTES), seq));
        AuditVerifier.Report r = AuditVerifier.verify(List.of(trail), key.publicKey());
        assertFalse(r.ok(), "bytes written unlike the bytes hashed must fail");
        assertEquals(seq, r.firstBadSeq(), r.problems()::toString);
    }

    /** Planted bug: changes one byte inside the body of record {@code seq} on its way to disk (as a broken encoder would). */
    private static final class FlipOneByteSink implements AuditSink {
        private final AuditSink delegate;
        private final byte[] prefix;

        FlipOneByteSink(AuditSink delegate, long seq) {
            this.delegate = delegate;
            this.prefix = ("{\"seq\":" + seq + ",").getBytes(StandardCharsets.US_ASCII);
        }

        @Override
        public void append(byte[] bytes, int offset, int length) throws IOException {
            byte[] copy = Arrays.copyOfRange(bytes, offset, offset + length);
            for (int start = 0; start < copy.length; start = indexOfNewline(copy, start) + 1) {
                if (Arrays.equals(copy, start, start + prefix.length, prefix, 0, prefix.length)) {
                    int inBody = start + prefix.length + 20;
                    copy[inBody] = (byte) (copy[inBody] == 'a' ? 'b' : 'a');
                }
            }
            delegate.append(copy, 0, copy.length);
        }

        private static int indexOfNewline(byte[] b, int from) {
            int i = from;
            while (b[i] != '\n') {
                i++;
            }
            return i;
        }

        @Override
        public void append(List<String> lines) throws IOException {
            throw new AssertionError("the trail hands sinks bytes");
        }

        @Override
        public void sync() throws IOException {
            delegate.sync();
        }

        @Override
        public String describe() {
            return "flip-one-byte(" + delegate.describe() + ")";
        }

        @Override
        public void close() throws IOException {
            delegate.close();
        }
    }
}
