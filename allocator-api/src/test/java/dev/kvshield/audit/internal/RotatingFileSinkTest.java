package dev.kvshield.audit.internal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.AuditSink;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Rotation of the byte path: whole lines per file, a line over the limit alone in its file, batches across files. */
class RotatingFileSinkTest {
    @TempDir
    Path dir;

    private static String line(char c, int chars) {
        return String.valueOf(c).repeat(chars);
    }

    private String file(int index) throws IOException {
        return Files.readString(dir.resolve(RotatingFileSink.fileName("t", index)), StandardCharsets.UTF_8);
    }

    @Test
    void rotatesBeforeALineWouldCrossTheLimitAndNeverSplitsOne() throws IOException {
        String a = line('a', 599);
        String b = line('b', 2999);
        String c = line('c', 399);
        String d = line('d', 399);
        String e = line('é', 150);
        byte[] batch = (a + "\n" + b + "\n" + c + "\n" + d + "\n" + e + "\n").getBytes(StandardCharsets.UTF_8);
        try (RotatingFileSink sink = new RotatingFileSink(dir, "t", 1024)) {
            sink.append(batch, 0, batch.length);
            sink.append(List.of(c));
        }
        assertEquals(a + "\n", file(1));
        assertEquals(b + "\n", file(2), "a line over the limit gets a file of its own");
        assertEquals(c + "\n" + d + "\n", file(3));
        assertEquals(e + "\n" + c + "\n", file(4), "'é' counts two bytes: 301 more would cross the limit of file 3");
        try (Stream<Path> files = Files.list(dir)) {
            assertEquals(4, files.count());
        }
    }

    @Test
    void refusesBytesThatDoNotEndALine() throws IOException {
        byte[] bytes = "{}\n{".getBytes(StandardCharsets.US_ASCII);
        try (RotatingFileSink sink = new RotatingFileSink(dir, "t", 1024)) {
            IllegalArgumentException x = assertThrows(IllegalArgumentException.class, () -> sink.append(bytes, 0, bytes.length));
            assertEquals("audit lines must end with a newline: the last of 4 bytes is 123", x.getMessage());
            sink.append(bytes, 0, 3);
        }
        assertEquals("{}\n", file(1), "the refused batch wrote nothing");
    }

    /**
     * Attack round 14: retention removed a trail's first file and kept its later ones; the prefix is
     * still taken (a new trail under it would splice into the old one and fail at its first rotation).
     */
    @Test
    void aPrefixWithOnlyLaterFilesLeftIsTaken() throws IOException {
        Files.writeString(dir.resolve(RotatingFileSink.fileName("audit-p-r0-boot1", 2)), "{}\n");
        Files.writeString(dir.resolve(RotatingFileSink.fileName("audit-p-r0-boot10", 1)), "{}\n");
        assertTrue(AuditSink.holdsTrail(dir, "audit-p-r0-boot1"));
        assertTrue(AuditSink.holdsTrail(dir, "audit-p-r0-boot10"));
        assertFalse(AuditSink.holdsTrail(dir, "audit-p-r0-boot2"), "boot10's files are not boot1's or boot2's");
        assertFalse(AuditSink.holdsTrail(dir.resolve("missing"), "audit-p-r0-boot1"));
        IOException x = assertThrows(IOException.class, () -> new RotatingFileSink(dir, "audit-p-r0-boot1", 1024));
        assertTrue(x.getMessage().contains("already holds a trail with prefix 'audit-p-r0-boot1'"), x.getMessage());
        new RotatingFileSink(dir, "audit-p-r0-boot2", 1024).close();
    }
}
