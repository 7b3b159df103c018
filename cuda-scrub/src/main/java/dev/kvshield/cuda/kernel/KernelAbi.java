package dev.kvshield.cuda.kernel;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;

/**
 * The Java side of the kernels' parameter contract in {@code src/main/cuda/kvshield_kernels.cu},
 * shared by the CUDA backend and the host build the tests drive, so both launch the kernels with
 * the same arguments.
 *
 * <p>Every kernel takes {@code (bases, pageBytes, bufferCount, entries, count, unitsPerRegion,
 * ...)}: {@code bases} holds one 64-bit base address per global buffer, {@code pageBytes} one
 * 32-bit page size per buffer, {@code entries} the batch as 32-bit words (scrub and verify-zero:
 * {@code count} pages; chacha20-xor: {@code count} pages, then {@code count} generations, then
 * {@code count} key slots). Limits the kernels rely on are checked here, in Java, before a launch.
 */
public final class KernelAbi {
    /** Kernel entry points (their {@code extern "C"} names in the PTX). */
    public static final String SCRUB = "kvs_scrub";
    public static final String VERIFY_ZERO = "kvs_verify_zero";
    public static final String CHACHA20_XOR = "kvs_chacha20_xor";
    /** Benchmark baseline: a plain read of a region, folded so the loads stay. */
    public static final String READ_FOLD = "kvs_read_fold";

    /** Bytes one scrub or verify-zero thread step covers (one 16-byte store or load). */
    public static final int SCRUB_UNIT_BYTES = 16;
    /** Bytes one chacha20-xor thread step covers: one ChaCha20 block. */
    public static final int CHACHA_BLOCK_BYTES = 64;
    /** Distinct keys one chacha20-xor launch carries (KVS_MAX_KEYS in the source). */
    public static final int MAX_KEY_SLOTS = 16;
    /** Bytes of one ChaCha20 key. */
    public static final int KEY_BYTES = 32;
    /** Bytes of the by-value key parameter ({@code struct KvsKeys}). */
    public static final int KEY_SLOTS_BYTES = MAX_KEY_SLOTS * KEY_BYTES;
    /** Threads per block of every launch. */
    public static final int THREADS_PER_BLOCK = 256;
    /** Required alignment of every buffer base address, so aligned pages take 16-byte accesses. */
    public static final int BASE_ALIGNMENT_BYTES = 16;

    private KernelAbi() {}

    /**
     * Units of {@code unitBytes} covering one page of the pool's largest buffer (every buffer
     * counted: an explicit geometry's buffers differ in size; threads past a smaller page's end do
     * nothing).
     */
    public static int unitsPerRegion(PoolGeometry geometry, int unitBytes) {
        return (int) ((geometry.maxPageBytes() + unitBytes - 1) / unitBytes);
    }

    /** Thread steps one launch over {@code count} pages makes. */
    public static long totalUnits(PoolGeometry geometry, int count, int unitsPerRegion) {
        return (long) count * geometry.bufferCount() * unitsPerRegion;
    }

    /**
     * Blocks for a grid-stride launch over {@code totalUnits}: enough for one unit per thread, at
     * most {@code maxBlocks} (a few waves of the device; the loop covers the rest), at least one.
     */
    public static int blocks(long totalUnits, int maxBlocks) {
        long wanted = (totalUnits + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;
        return (int) Math.max(1, Math.min(wanted, maxBlocks));
    }

    /** Page sizes of every global buffer, as the kernels' {@code pageBytes} table holds them. */
    public static int[] pageBytesTable(PoolGeometry geometry) {
        int[] table = new int[geometry.bufferCount()];
        for (int b = 0; b < table.length; b++) {
            table[b] = Math.toIntExact(geometry.pageBytes(b));
        }
        return table;
    }

    /**
     * Checks a buffer base address for the kernels: positive and {@value #BASE_ALIGNMENT_BYTES}-byte
     * aligned.
     *
     * @throws InvalidGeometryException naming the buffer and address otherwise
     */
    public static void checkBase(int buffer, long address) {
        if (address <= 0 || (address & (BASE_ALIGNMENT_BYTES - 1)) != 0) {
            throw new InvalidGeometryException("buffer " + buffer + " base address 0x" + Long.toHexString(address)
                    + " must be positive and " + BASE_ALIGNMENT_BYTES + "-byte aligned");
        }
    }

    /**
     * Checks a batch {@code pages[offset .. offset+count)} against the geometry before anything is
     * staged or launched.
     *
     * @throws IllegalArgumentException if the range lies outside the array
     * @throws InvalidGeometryException naming the first page out of range
     */
    public static void checkPages(PoolGeometry geometry, int[] pages, int offset, int count) {
        if (offset < 0 || count < 0 || offset > pages.length - count) {
            throw new IllegalArgumentException("page list range [" + offset + ", " + ((long) offset + count)
                    + ") outside an array of " + pages.length);
        }
        for (int i = offset; i < offset + count; i++) {
            geometry.checkPage(pages[i]);
        }
    }

    /**
     * Checks a chacha20-xor batch: pages in range and distinct (XOR twice in one launch would undo
     * itself), one generation and one key slot below {@code keyCount} per page. {@code seenScratch}
     * holds at least {@code pageCount} bits, all clear; they are clear again on return.
     */
    public static void checkSealBatch(PoolGeometry geometry, int[] pages, int[] generations, byte[] keySlots, int offset,
            int count, int keyCount, long[] seenScratch) {
        checkPages(geometry, pages, offset, count);
        if (generations.length < offset + count || keySlots.length < offset + count) {
            throw new IllegalArgumentException("generations (" + generations.length + ") and key slots (" + keySlots.length
                    + ") must cover the page range [" + offset + ", " + (offset + count) + ")");
        }
        if (keyCount < 1 || keyCount > MAX_KEY_SLOTS) {
            throw new IllegalArgumentException("a launch carries 1 to " + MAX_KEY_SLOTS + " keys, not " + keyCount);
        }
        for (int i = offset; i < offset + count; i++) {
            if (keySlots[i] < 0 || keySlots[i] >= keyCount) {
                throw new IllegalArgumentException("page " + pages[i] + " names key slot " + keySlots[i] + " of " + keyCount);
            }
        }
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            if ((seenScratch[page >>> 6] & (1L << page)) != 0) {
                clearBits(seenScratch, pages, offset, i);
                throw new IllegalArgumentException("page " + page + " is listed twice in one seal batch");
            }
            seenScratch[page >>> 6] |= 1L << page;
        }
        clearBits(seenScratch, pages, offset, offset + count);
    }

    private static void clearBits(long[] bits, int[] pages, int from, int to) {
        for (int i = from; i < to; i++) {
            bits[pages[i] >>> 6] = 0;
        }
    }
}
