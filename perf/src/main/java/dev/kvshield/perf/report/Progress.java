package dev.kvshield.perf.report;

import java.io.PrintStream;

/**
 * The one-line progress display of a report run: what is running, how far along, how long is left
 * (estimated from the time the finished units took). Rewrites its line on a terminal.
 */
public final class Progress {
    private final PrintStream out;
    private final long start = System.nanoTime();
    private double totalUnits;
    private double doneUnits;

    public Progress(PrintStream out, double totalUnits) {
        this.out = out;
        this.totalUnits = totalUnits;
    }

    /** Shows what starts now. */
    public void show(String what) {
        if (out == null) {
            return;
        }
        double elapsed = (System.nanoTime() - start) / 1e9;
        String left = doneUnits == 0 ? "estimating" : "about " + Math.round(elapsed / doneUnits * (totalUnits - doneUnits)) + " s left";
        String line = String.format(java.util.Locale.ROOT, "kvshield report: %-40s %3.0f%%  %4.0f s elapsed, %s", what,
                100 * doneUnits / totalUnits, elapsed, left);
        out.print("\r" + line + "   ");
        out.flush();
    }

    /** Adds {@code units} of work not foreseen at the start (e.g. another warm-up pass). */
    public void extend(double units) {
        totalUnits += units;
    }

    /** Marks {@code units} of work done. */
    public void done(double units) {
        doneUnits += units;
    }

    public void finish(String message) {
        if (out != null) {
            out.println("\r" + message + " ".repeat(40));
        }
    }

    public double elapsedSeconds() {
        return (System.nanoTime() - start) / 1e9;
    }
}
