package dev.kvshield.audit.internal;

import dev.kvshield.audit.AuditSink;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;

/**
 * JSON lines files rotated by size. Never splits a line; a line larger than the limit gets a file
 * of its own. Files are created new (never appended to or overwritten).
 */
public final class RotatingFileSink implements AuditSink {
    private final Path dir;
    private final String prefix;
    private final long maxFileBytes;
    private FileChannel channel;
    private long fileBytes;
    private int fileIndex;

    public RotatingFileSink(Path dir, String prefix, long maxFileBytes) throws IOException {
        if (maxFileBytes < 1024) {
            throw new IllegalArgumentException("maxFileBytes must be >= 1024: maxFileBytes=" + maxFileBytes);
        }
        if (prefix == null || !prefix.matches("[A-Za-z0-9._-]+")) {
            throw new IllegalArgumentException("file prefix must match [A-Za-z0-9._-]+: '" + prefix + "'");
        }
        this.dir = dir;
        this.prefix = prefix;
        this.maxFileBytes = maxFileBytes;
        Files.createDirectories(dir);
        if (Files.exists(fileName(1))) {
            throw new IOException("audit directory " + dir + " already holds a trail with prefix '" + prefix
                    + "'; use a new prefix or directory (a trail is never appended to)");
        }
        rotate();
    }

    /** The name of file number {@code index} (1-based) of a trail. */
    public static String fileName(String prefix, int index) {
        return String.format("%s-%06d.jsonl", prefix, index);
    }

    private Path fileName(int index) {
        return dir.resolve(fileName(prefix, index));
    }

    private void rotate() throws IOException {
        if (channel != null) {
            channel.force(true);
            channel.close();
        }
        fileIndex++;
        channel = FileChannel.open(fileName(fileIndex), StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE);
        fileBytes = 0;
    }

    @Override
    public void append(List<String> lines) throws IOException {
        StringBuilder chunk = new StringBuilder();
        long chunkBytes = 0;
        for (String line : lines) {
            long lineBytes = utf8Length(line) + 1;
            if (fileBytes + chunkBytes > 0 && fileBytes + chunkBytes + lineBytes > maxFileBytes) {
                write(chunk);
                chunk.setLength(0);
                chunkBytes = 0;
                rotate();
            }
            chunk.append(line).append('\n');
            chunkBytes += lineBytes;
        }
        write(chunk);
    }

    private void write(StringBuilder chunk) throws IOException {
        ByteBuffer buf = ByteBuffer.wrap(chunk.toString().getBytes(StandardCharsets.UTF_8));
        while (buf.hasRemaining()) {
            fileBytes += channel.write(buf);
        }
    }

    /** UTF-8 length without encoding (records are ASCII but for tenant names). */
    private static long utf8Length(String s) {
        long n = s.length();
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c >= 0x80) {
                n += c >= 0x800 && !Character.isSurrogate(c) ? 2 : 1;
            }
        }
        return n;
    }

    @Override
    public void sync() throws IOException {
        channel.force(false);
    }

    @Override
    public String describe() {
        return fileName(fileIndex).toString();
    }

    @Override
    public void close() throws IOException {
        channel.force(true);
        channel.close();
    }
}
