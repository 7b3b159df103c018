package dev.kvshield.testing;

import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.memory.PageMemory;

/**
 * A backend that fails in the middle of a batch: once armed, a scrub (or a verify) does its first
 * {@code k} pages, counted across calls from the arming, and then throws, for the next
 * {@code failures} calls that reach that point. The planted-bug variant {@link #swallowing} does the
 * same partial work and then reports success, as a backend that loses an error would;
 * {@link #losingRetries} throws its first fault and loses the later ones.
 *
 * <p>{@link #scrubAndVerify} is the interface default (scrub, then verify), so both halves can fail.
 */
public class FaultyPageMemory extends ForwardingPageMemory {
    /** Which operation fails. */
    public enum Op { SCRUB, VERIFY }

    private final int thrownBeforeSwallowing;
    private Op op;
    private int pagesLeft = -1;
    private int failuresLeft;
    private int faults;

    private FaultyPageMemory(PageMemory delegate, int thrownBeforeSwallowing) {
        super(delegate);
        this.thrownBeforeSwallowing = thrownBeforeSwallowing;
    }

    public static FaultyPageMemory failing(PageMemory delegate) {
        return new FaultyPageMemory(delegate, Integer.MAX_VALUE);
    }

    /** Planted bug: after {@code k} pages the backend stops working but returns normally. */
    public static FaultyPageMemory swallowing(PageMemory delegate) {
        return new FaultyPageMemory(delegate, 0);
    }

    /** Planted bug: the first fault throws; every later one (the retries) stops working and returns normally. */
    public static FaultyPageMemory losingRetries(PageMemory delegate) {
        return new FaultyPageMemory(delegate, 1);
    }

    /** The next {@code failures} calls of {@code op} fail after {@code afterPages} pages in all (counted from now). */
    public synchronized FaultyPageMemory arm(Op op, int afterPages, int failures) {
        this.op = op;
        this.pagesLeft = afterPages;
        this.failuresLeft = failures;
        return this;
    }

    public synchronized void disarm() {
        pagesLeft = -1;
        failuresLeft = 0;
    }

    /** Faults injected so far (thrown or swallowed). */
    public synchronized int faults() {
        return faults;
    }

    private synchronized boolean swallows() {
        return faults > thrownBeforeSwallowing;
    }

    /** How many of {@code count} pages the next call of {@code o} may do before it faults; {@code count} if it does not. */
    private synchronized int allowed(Op o, int count) {
        if (o != op || failuresLeft == 0 || pagesLeft < 0) {
            return count;
        }
        if (pagesLeft >= count) {
            pagesLeft -= count;
            return count;
        }
        int k = pagesLeft;
        pagesLeft = 0;
        failuresLeft--;
        faults++;
        return k;
    }

    @Override
    public void scrub(int[] pages, int offset, int count) {
        int k = allowed(Op.SCRUB, count);
        super.scrub(pages, offset, k);
        if (k < count && !swallows()) {
            throw new IllegalStateException("injected scrub fault after " + k + " of " + count + " pages");
        }
    }

    @Override
    public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        int k = allowed(Op.VERIFY, count);
        int dirty = super.verifyZero(pages, offset, k, dirtyOut);
        if (k < count && !swallows()) {
            throw new IllegalStateException("injected verify fault after " + k + " of " + count + " pages");
        }
        return dirty;
    }
}
