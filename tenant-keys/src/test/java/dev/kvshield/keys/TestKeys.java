package dev.kvshield.keys;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

/** Test helpers: key files, key extraction for comparisons, and log capture. */
final class TestKeys {
    private TestKeys() {}

    /** Writes {@code bytes} to a new file with the given POSIX permissions (e.g. "rw-------"). */
    static Path keyFile(Path dir, String name, byte[] bytes, String permissions) {
        try {
            Path p = dir.resolve(name);
            Files.write(p, bytes);
            Files.setPosixFilePermissions(p, PosixFilePermissions.fromString(permissions));
            return p;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static byte[] sequential(int n, int start) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) {
            b[i] = (byte) (start + i);
        }
        return b;
    }

    /** The 32 bytes of (tenant, epoch)'s data key, through the kernel-launch export. */
    static byte[] keyBytes(TenantKeyring keyring, int tenant, int epoch) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment dst = arena.allocate(TenantKeyring.KEY_BYTES);
            keyring.copyKeyForKernelLaunchDangerously(tenant, epoch, dst);
            return dst.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    /**
     * Captures every record logged through System.Logger (its JUL backend) while open, at every
     * level: the root logger is opened to {@code ALL} and restored on close.
     */
    static final class LogCapture extends Handler implements AutoCloseable {
        private final List<LogRecord> records = new ArrayList<>();
        private final Logger root = Logger.getLogger("");
        private final java.util.logging.Level rootLevel = root.getLevel();

        LogCapture() {
            setLevel(java.util.logging.Level.ALL);
            root.setLevel(java.util.logging.Level.ALL);
            root.addHandler(this);
        }

        @Override
        public synchronized void publish(LogRecord record) {
            records.add(record);
        }

        synchronized List<String> messages() {
            List<String> out = new ArrayList<>();
            for (LogRecord r : records) {
                out.add(r.getLevel() + " " + r.getLoggerName() + ": " + r.getMessage());
            }
            return out;
        }

        @Override
        public void flush() {}

        @Override
        public void close() {
            root.removeHandler(this);
            root.setLevel(rootLevel);
        }
    }
}
