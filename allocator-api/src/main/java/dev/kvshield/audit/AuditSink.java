package dev.kvshield.audit;

import dev.kvshield.audit.internal.RotatingFileSink;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Where audit record lines go (SPI). Called by one trail: {@code append} one call at a time, in
 * order, from the trail's writer thread (or the scheduler's, when it writes a batch the writer has
 * not started), {@code sync} and finally {@code close} from the trail's durability thread, a sync
 * possibly while an {@code append} runs — a sink must allow a sync to overlap an append. A sink that cannot write
 * or sync throws: the trail then stops handing out pages under {@code COMPLIANCE} and counts
 * dropped records otherwise — a sink never swallows a failure.
 */
public interface AuditSink extends AutoCloseable {
    /** Appends complete record lines (each without its newline), in order. */
    void append(List<String> lines) throws IOException;

    /**
     * Appends complete record lines given as UTF-8 bytes: {@code bytes[offset, offset + length)},
     * each line ending in {@code '\n'}, in order. This is what the trail calls; the bytes are only
     * valid during the call. The default decodes the lines and calls {@link #append(List)}; a sink
     * that writes bytes overrides it to skip the round trip.
     */
    default void append(byte[] bytes, int offset, int length) throws IOException {
        List<String> lines = new ArrayList<>();
        int start = offset;
        for (int i = offset; i < offset + length; i++) {
            if (bytes[i] == '\n') {
                lines.add(new String(bytes, start, i - start, StandardCharsets.UTF_8));
                start = i + 1;
            }
        }
        if (start != offset + length) {
            throw new IllegalArgumentException("audit lines must end with a newline: " + (offset + length - start)
                    + " trailing bytes after the last one");
        }
        append(lines);
    }

    /**
     * Forces everything appended before the call to stable storage; called after every checkpoint,
     * before it is shipped, on the trail's durability thread (see the class comment).
     */
    void sync() throws IOException;

    /** For messages: where the records go. */
    String describe();

    @Override
    void close() throws IOException;

    /**
     * JSON lines files {@code dir/prefix-000001.jsonl}, {@code -000002}, ...: a new file starts
     * before a line would take the current one past {@code maxFileBytes}; the hash chain runs on
     * across files. Refuses a directory that already holds any file of this prefix ({@link #holdsTrail}).
     */
    static AuditSink rotatingFiles(Path dir, String prefix, long maxFileBytes) throws IOException {
        return new RotatingFileSink(dir, prefix, maxFileBytes);
    }

    /**
     * The {@link #rotatingFiles} prefix of one boot of pool {@code poolId}'s trail on {@code rank}: {@code
     * audit-<pool>-r<rank>-boot<boot>}, as an engine names each pool's trail (the SGLang bridge); {@code audit verify}
     * holds a file so named to the pool and rank of the records inside.
     */
    static String poolTrailPrefix(String poolId, int rank, int boot) {
        return "audit-" + poolId + "-r" + rank + "-boot" + boot;
    }

    /**
     * The name of the lock file an engine holds in its audit directory while it writes pool {@code poolId}'s trail on
     * {@code rank} (the SGLang bridge): {@code audit-<pool>-r<rank>.lock}, beside the {@link #poolTrailPrefix} files.
     */
    static String poolTrailLock(String poolId, int rank) {
        return "audit-" + poolId + "-r" + rank + ".lock";
    }

    /**
     * Whether {@code dir} holds any {@link #rotatingFiles} file with {@code prefix}, whichever its
     * number (the first may have been removed while later ones remain); then that prefix is taken.
     *
     * @throws IOException if {@code dir} exists but cannot be listed
     */
    static boolean holdsTrail(Path dir, String prefix) throws IOException {
        return RotatingFileSink.holdsFiles(dir, prefix);
    }
}
