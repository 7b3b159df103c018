package dev.kvshield.audit;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * Sends each signed checkpoint line off the audited host's log (a file another machine collects, a
 * log line an external collector keeps), so truncating or rewriting the log is caught against a
 * copy the host no longer controls. A shipper that throws is counted; the checkpoint stays in the log.
 */
@FunctionalInterface
public interface CheckpointShipper {
    void ship(String checkpointLine) throws IOException;

    /** Appends each checkpoint line to {@code file} (created if missing). */
    static CheckpointShipper appendingTo(Path file) {
        return line -> Files.writeString(file, line + "\n", StandardCharsets.UTF_8, StandardOpenOption.CREATE,
                StandardOpenOption.APPEND, StandardOpenOption.WRITE);
    }

    /** Logs each checkpoint line at INFO on logger {@code dev.kvshield.audit.checkpoints}. */
    static CheckpointShipper logLine() {
        System.Logger log = System.getLogger("dev.kvshield.audit.checkpoints");
        return line -> log.log(System.Logger.Level.INFO, line);
    }
}
