package dev.kvshield.audit;

import dev.kvshield.audit.internal.RotatingFileSink;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;

/**
 * Where audit record lines go (SPI). Called by one trail at a time, under the trail's lock.
 * A sink that cannot write throws: the trail then stops handing out pages under
 * {@code COMPLIANCE} and counts dropped records otherwise — a sink never swallows a failure.
 */
public interface AuditSink extends AutoCloseable {
    /** Appends complete record lines (each without its newline), in order. */
    void append(List<String> lines) throws IOException;

    /** Forces everything appended so far to stable storage; called at every checkpoint. */
    void sync() throws IOException;

    /** For messages: where the records go. */
    String describe();

    @Override
    void close() throws IOException;

    /**
     * JSON lines files {@code dir/prefix-000001.jsonl}, {@code -000002}, ...: a new file starts
     * before a line would take the current one past {@code maxFileBytes}; the hash chain runs on
     * across files. Refuses a directory that already holds a file of this prefix.
     */
    static AuditSink rotatingFiles(Path dir, String prefix, long maxFileBytes) throws IOException {
        return new RotatingFileSink(dir, prefix, maxFileBytes);
    }
}
