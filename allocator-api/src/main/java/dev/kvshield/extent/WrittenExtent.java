package dev.kvshield.extent;

import dev.kvshield.internal.Bits;
import dev.kvshield.internal.Digests;
import java.util.Arrays;

/**
 * Which token slots of each page were written in the page's current generation. A read of a slot
 * not written since the page was handed out is an error, not data ({@link ReadBeforeWriteException}):
 * zeroing turns a leak into garbage, this turns it into a failed request.
 *
 * <p>A slot is <em>written</em> once every buffer of the pool wrote it (a whole-slot write, a
 * hand-out recorded as written, or one single-buffer write per buffer): that is what a read of
 * every buffer and a handoff's coverage need. A single-buffer write counts for that buffer alone
 * until then ({@link #markBuffer}, {@link #firstUnwritten(int, int, int, int)}), so a write of
 * layer 0 never unlocks what the page's previous owner left in layer 1.
 *
 * <p>Not thread-safe: guarded by the pool lock. Used only by the pool (ModuleBoundariesTest keeps it
 * inside allocator-api). Does not allocate, except once, at the first single-buffer write.
 *
 * <p>Implementation notes: whole slots are one bit per (page, slot) in {@link #written}. Partial
 * slots keep one bit per (page, buffer, slot) and a count of buffers per (page, slot), allocated
 * lazily (engines that write KV themselves never make one) and cleared when a page with any starts
 * its next generation, so the hand-out path reads one flag per page and stores nothing more.
 */
public final class WrittenExtent {
    private final long[] written;
    private final int wordsPerPage;
    private final int slotsPerPage;
    private final int bufferCount;
    private final int pageCount;
    private final int partialWordsPerPage;
    /** Per page: whether it has partial slots in this generation; null until the first single-buffer write. */
    private boolean[] hasPartial;
    /** Per (page, buffer, slot): written by that buffer in this generation; only for pages with {@link #hasPartial}. */
    private long[] partialBits;
    /** Per (page, slot): buffers that wrote it in this generation while it is partial. */
    private int[] buffersWrote;

    public WrittenExtent(int pageCount, int slotsPerPage, int bufferCount) {
        this.pageCount = pageCount;
        this.slotsPerPage = slotsPerPage;
        this.bufferCount = bufferCount;
        wordsPerPage = Bits.words(slotsPerPage);
        partialWordsPerPage = Bits.words(bufferCount * slotsPerPage);
        written = new long[pageCount * wordsPerPage];
    }

    public int slotsPerPage() {
        return slotsPerPage;
    }

    /**
     * Starts the page's new generation: every slot forgotten, then {@code [0, writtenSlots)} written (0: none).
     *
     * <p>Implementation notes: a page of at most 64 slots (one word, every token allocator's) is one store; the partial
     * slots' clearing is out of line, so this is small enough to be inlined into a hand-out's per-page loop.
     */
    public void startGeneration(int page, int writtenSlots) {
        if (wordsPerPage == 1) {
            int bits = Math.max(0, Math.min(64, writtenSlots));
            written[page] = bits == 64 ? -1L : (1L << bits) - 1;
        } else {
            startWords(page, writtenSlots);
        }
        if (hasPartial != null && hasPartial[page]) {
            clearPartial(page);
        }
    }

    private void startWords(int page, int writtenSlots) {
        int base = page * wordsPerPage;
        for (int w = 0; w < wordsPerPage; w++) {
            int from = w << 6;
            int bits = Math.max(0, Math.min(64, writtenSlots - from));
            written[base + w] = bits == 64 ? -1L : (1L << bits) - 1;
        }
    }

    private void clearPartial(int page) {
        hasPartial[page] = false;
        Bits.clear(partialBits, page * partialWordsPerPage, partialWordsPerPage);
        Arrays.fill(buffersWrote, page * slotsPerPage, (page + 1) * slotsPerPage, 0);
    }

    /** Records slots {@code [fromSlot, toSlot)} as written in every buffer. */
    public void mark(int page, int fromSlot, int toSlot) {
        Bits.set(written, page * wordsPerPage, fromSlot, toSlot);
    }

    /**
     * Records {@code slot} as written by {@code buffer}; true when the slot is now written in every
     * buffer (it was already, or this write completed it: the caller then {@linkplain #mark marks}
     * it), false while some buffer has not written it.
     */
    public boolean markBuffer(int page, int buffer, int slot) {
        if (bufferCount == 1 || Bits.allSet(written, page * wordsPerPage, slot, slot + 1)) {
            return true;
        }
        if (hasPartial == null) {
            hasPartial = new boolean[pageCount];
            partialBits = new long[Math.multiplyExact(pageCount, partialWordsPerPage)];
            buffersWrote = new int[Math.multiplyExact(pageCount, slotsPerPage)];
        }
        int base = page * partialWordsPerPage;
        int bit = buffer * slotsPerPage + slot;
        if (Bits.allSet(partialBits, base, bit, bit + 1)) {
            return false; // NOTE: this buffer again; the slot is still partial
        }
        hasPartial[page] = true;
        Bits.set(partialBits, base, bit, bit + 1);
        return ++buffersWrote[page * slotsPerPage + slot] == bufferCount;
    }

    public boolean allWritten(int page, int fromSlot, int toSlot) {
        return Bits.allSet(written, page * wordsPerPage, fromSlot, toSlot);
    }

    /** The first slot of {@code [fromSlot, toSlot)} not written in every buffer in this generation, or -1. */
    public int firstUnwritten(int page, int fromSlot, int toSlot) {
        return Bits.firstUnset(written, page * wordsPerPage, fromSlot, toSlot);
    }

    /** The first slot of {@code [fromSlot, toSlot)} that {@code buffer} has not got written in this generation, or -1. */
    public int firstUnwritten(int page, int buffer, int fromSlot, int toSlot) {
        int slot = firstUnwritten(page, fromSlot, toSlot);
        if (slot < 0 || hasPartial == null || !hasPartial[page]) {
            return slot;
        }
        int base = page * partialWordsPerPage;
        for (; slot < toSlot; slot++) {
            int bit = buffer * slotsPerPage + slot;
            if (!allWritten(page, slot, slot + 1) && !Bits.allSet(partialBits, base, bit, bit + 1)) {
                return slot;
            }
        }
        return -1;
    }

    public long digest(long h, int page) {
        for (int w = 0; w < wordsPerPage; w++) {
            h = Digests.mix(h, written[page * wordsPerPage + w]);
        }
        if (hasPartial != null && hasPartial[page]) {
            for (int w = 0; w < partialWordsPerPage; w++) {
                h = Digests.mix(h, partialBits[page * partialWordsPerPage + w]);
            }
        }
        return h;
    }
}
