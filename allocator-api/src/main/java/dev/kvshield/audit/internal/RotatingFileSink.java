package dev.kvshield.audit.internal;

import dev.kvshield.audit.AuditSink;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * JSON lines files rotated by size. Never splits a line; a line larger than the limit gets a file
 * of its own. Files are created new (never appended to or overwritten). Lines are written as the
 * trail's bytes through one reused direct buffer, looked at line by line only when a batch would
 * cross the size limit.
 *
 * <p>{@link #sync()} may run on another thread while {@link #append} writes (the trail's durability
 * thread): it forces the file being written when it starts; a file rotated away or closed since
 * was forced before it was closed.
 */
public final class RotatingFileSink implements AuditSink {
    private static final int WRITE_BUFFER_BYTES = 256 * 1024;
    private final Path dir;
    private final String prefix;
    private final long maxFileBytes;
    private final ByteBuffer out = ByteBuffer.allocateDirect(WRITE_BUFFER_BYTES);
    /** The file being written; read by {@link #sync()} on another thread. */
    private volatile FileChannel channel;
    private long fileBytes;
    /** For messages; {@link #describe()} may lag a rotation when called from another thread. */
    private volatile int fileIndex;

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
        if (holdsFiles(dir, prefix)) {
            throw new IOException("audit directory " + dir + " already holds a trail with prefix '" + prefix
                    + "'; use a new prefix or directory (a trail is never appended to)");
        }
        rotate();
    }

    /**
     * Whether {@code dir} holds any file of the trail {@code prefix} names ({@code prefix-<number>.jsonl}):
     * the first one may be gone (retention removes the oldest) while later ones remain.
     */
    public static boolean holdsFiles(Path dir, String prefix) throws IOException {
        if (!Files.isDirectory(dir)) {
            return false;
        }
        Pattern ofTrail = Pattern.compile(Pattern.quote(prefix) + "-[0-9]{6,}\\.jsonl");
        try (Stream<Path> files = Files.list(dir)) {
            return files.anyMatch(f -> ofTrail.matcher(f.getFileName().toString()).matches());
        }
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
        ByteArrayOutputStream encoded = new ByteArrayOutputStream();
        for (String line : lines) {
            encoded.write(line.getBytes(StandardCharsets.UTF_8));
            encoded.write('\n');
        }
        append(encoded.toByteArray(), 0, encoded.size());
    }

    @Override
    public void append(byte[] bytes, int offset, int length) throws IOException {
        int end = offset + length;
        if (length > 0 && bytes[end - 1] != '\n') {
            throw new IllegalArgumentException("audit lines must end with a newline: the last of " + length + " bytes is "
                    + bytes[end - 1]);
        }
        if (fileBytes + length <= maxFileBytes) {
            write(bytes, offset, length);
            return;
        }
        int chunkStart = offset;
        for (int pos = offset; pos < end; ) {
            int lineEnd = pos;
            while (bytes[lineEnd] != '\n') {
                lineEnd++;
            }
            long pending = fileBytes + (pos - chunkStart);
            if (pending > 0 && pending + (lineEnd + 1 - pos) > maxFileBytes) {
                write(bytes, chunkStart, pos - chunkStart);
                rotate();
                chunkStart = pos;
            }
            pos = lineEnd + 1;
        }
        write(bytes, chunkStart, end - chunkStart);
    }

    /** Writes through {@link #out}: the channel copies from a heap buffer into a direct one anyway. */
    private void write(byte[] bytes, int offset, int length) throws IOException {
        while (length > 0) {
            int n = Math.min(length, out.capacity());
            out.clear().put(bytes, offset, n).flip();
            while (out.hasRemaining()) {
                fileBytes += channel.write(out);
            }
            offset += n;
            length -= n;
        }
    }

    @Override
    public void sync() throws IOException {
        FileChannel c = channel;
        try {
            c.force(false);
        } catch (ClosedChannelException e) {
            // Rotated away or closed since the call began: rotate() and close() force a file before closing it.
        }
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
