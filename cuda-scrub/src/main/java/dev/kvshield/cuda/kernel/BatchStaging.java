package dev.kvshield.cuda.kernel;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Writes a batch into the 32-bit entry layout the kernels read (see {@link KernelAbi}) and reads
 * verify-zero's per-entry flags back. Operates on caller-owned segments (pinned host memory for
 * the CUDA backend, off-heap memory for the host build), so it never allocates.
 */
public final class BatchStaging {
    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED;

    private BatchStaging() {}

    /** Bytes of staging a batch of {@code count} entries needs for chacha20-xor (the largest layout). */
    public static long sealEntryBytes(int count) {
        return 3L * count * Integer.BYTES;
    }

    /** Writes {@code pages[offset .. offset+count)} from index 0; returns the bytes written. */
    public static long stagePages(MemorySegment entries, int[] pages, int offset, int count) {
        MemorySegment.copy(pages, offset, entries, U32, 0, count);
        return (long) count * Integer.BYTES;
    }

    /** Writes pages, then generations, then key slots, each {@code count} words; returns the bytes written. */
    public static long stageSeal(MemorySegment entries, int[] pages, int[] generations, byte[] keySlots, int offset,
            int count) {
        long words = count;
        MemorySegment.copy(pages, offset, entries, U32, 0, count);
        MemorySegment.copy(generations, offset, entries, U32, words * Integer.BYTES, count);
        long slotsAt = 2 * words * Integer.BYTES;
        for (int i = 0; i < count; i++) {
            entries.set(U32, slotsAt + (long) i * Integer.BYTES, keySlots[offset + i]);
        }
        return sealEntryBytes(count);
    }

    /**
     * Copies the pages whose flag is non-zero into {@code dirtyOut} from index 0, in list order.
     *
     * @return how many pages were flagged
     */
    public static int collectDirty(MemorySegment flags, int[] pages, int offset, int count, int[] dirtyOut) {
        int dirty = 0;
        for (int i = 0; i < count; i++) {
            if (flags.getAtIndex(ValueLayout.JAVA_INT, i) != 0) {
                dirtyOut[dirty++] = pages[offset + i];
            }
        }
        return dirty;
    }
}
