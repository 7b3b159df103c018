package dev.kvshield.perf.cli;

import java.io.IOException;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.logging.FileHandler;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;

/**
 * Where library logging goes while {@code report} runs: every module logs through
 * {@code System.Logger}, which the JDK backs with {@code java.util.logging}; this replaces the root
 * logger's handlers with one that appends to a file in the output folder and, with {@code
 * --verbose}, one that also prints each record on the terminal (on its own line, so the progress
 * line is not garbled). {@link #close()} puts the previous handlers and level back.
 *
 * <p>Not thread-safe to open twice at once: it swaps JVM-wide state; one report runs at a time.
 */
final class ReportLog implements AutoCloseable {
    /** The log file's name in the output folder. */
    static final String FILE_NAME = "report.log";

    private final Logger root = Logger.getLogger("");
    private final Handler[] previous;
    private final Level previousLevel;
    private final FileHandler file;
    private final Path path;

    /**
     * @param dir the output folder (created if missing)
     * @param console where records also go with {@code --verbose}, or null for the file only
     */
    ReportLog(Path dir, PrintStream console) {
        this.path = dir.resolve(FILE_NAME);
        try {
            Files.createDirectories(dir);
            // FileHandler reads '%' in its pattern as a placeholder (%t, %h, %u, %g): escape it.
            file = new FileHandler(path.toString().replace("%", "%%"), false);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot open the report's log file " + path, e);
        }
        file.setFormatter(new SimpleFormatter());
        file.setLevel(Level.ALL);
        previous = root.getHandlers();
        previousLevel = root.getLevel();
        for (Handler h : previous) {
            root.removeHandler(h);
        }
        root.addHandler(file);
        if (console != null) {
            root.addHandler(new ConsoleLines(console));
        }
        root.setLevel(Level.INFO);
    }

    Path path() {
        return path;
    }

    @Override
    public void close() {
        for (Handler h : root.getHandlers()) {
            root.removeHandler(h);
        }
        file.close();
        for (Handler h : previous) {
            root.addHandler(h);
        }
        root.setLevel(previousLevel);
    }

    /** Prints each record on a line of its own (after the progress line, which ends without one). */
    private static final class ConsoleLines extends Handler {
        private final PrintStream out;

        ConsoleLines(PrintStream out) {
            this.out = out;
            setFormatter(new SimpleFormatter());
        }

        @Override
        public void publish(LogRecord record) {
            if (isLoggable(record)) {
                out.print("\n" + getFormatter().format(record).stripTrailing() + "\n");
                out.flush();
            }
        }

        @Override
        public void flush() {
            out.flush();
        }

        @Override
        public void close() {
            flush();
        }
    }
}
