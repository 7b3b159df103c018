package dev.kvshield.extent;

import dev.kvshield.internal.Bits;
import dev.kvshield.internal.Digests;

/**
 * Which token slots of each page were written in the page's current generation. A read of a slot
 * not written since the page was handed out is an error, not data ({@link ReadBeforeWriteException}):
 * zeroing turns a leak into garbage, this turns it into a failed request.
 *
 * <p>Not thread-safe: guarded by the pool lock. Used only by the pool (ModuleBoundariesTest keeps it
 * inside allocator-api). Does not allocate.
 */
public final class WrittenExtent {
    private final long[] written;
    private final int wordsPerPage;
    private final int slotsPerPage;

    public WrittenExtent(int pageCount, int slotsPerPage) {
        this.slotsPerPage = slotsPerPage;
        wordsPerPage = Bits.words(slotsPerPage);
        written = new long[pageCount * wordsPerPage];
    }

    public int slotsPerPage() {
        return slotsPerPage;
    }

    /** Starts the page's new generation: every slot forgotten, then {@code [0, writtenSlots)} written (0: none). */
    public void startGeneration(int page, int writtenSlots) {
        int base = page * wordsPerPage;
        for (int w = 0; w < wordsPerPage; w++) {
            int from = w << 6;
            int bits = Math.max(0, Math.min(64, writtenSlots - from));
            written[base + w] = bits == 64 ? -1L : (1L << bits) - 1;
        }
    }

    public void mark(int page, int fromSlot, int toSlot) {
        Bits.set(written, page * wordsPerPage, fromSlot, toSlot);
    }

    public boolean allWritten(int page, int fromSlot, int toSlot) {
        return Bits.allSet(written, page * wordsPerPage, fromSlot, toSlot);
    }

    /** The first slot of {@code [fromSlot, toSlot)} not written in this generation, or -1. */
    public int firstUnwritten(int page, int fromSlot, int toSlot) {
        return Bits.firstUnset(written, page * wordsPerPage, fromSlot, toSlot);
    }

    public long digest(long h, int page) {
        for (int w = 0; w < wordsPerPage; w++) {
            h = Digests.mix(h, written[page * wordsPerPage + w]);
        }
        return h;
    }
}
