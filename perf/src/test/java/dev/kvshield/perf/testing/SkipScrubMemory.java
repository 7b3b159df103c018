package dev.kvshield.perf.testing;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.ForwardingPageMemory;

/**
 * Planted bug: a backend whose scrub returns without zeroing (and whose verify says every page is
 * clean), as a kernel launch that silently did nothing would. Start-up scrubs still run, so a fresh
 * pool starts clean.
 */
public final class SkipScrubMemory extends ForwardingPageMemory {
    private boolean started;

    public SkipScrubMemory(PageMemory delegate) {
        super(delegate);
    }

    /** From now on every scrub is skipped (call after the pool is built). */
    public void startSkipping() {
        started = true;
    }

    @Override
    public void scrub(int[] pages, int offset, int count) {
        if (!started) {
            super.scrub(pages, offset, count);
        }
    }

    @Override
    public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        return started ? 0 : super.verifyZero(pages, offset, count, dirtyOut);
    }
}
