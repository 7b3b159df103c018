package dev.kvshield.internal;

/** Slot bitsets stored in {@code long[]} at a word offset. */
public final class Bits {
    private Bits() {}

    public static int words(int bits) {
        return (bits + 63) >>> 6;
    }

    /** Sets bits {@code [from, to)}. */
    public static void set(long[] words, int base, int from, int to) {
        for (int i = from; i < to; ) {
            int w = i >>> 6;
            int lo = i & 63;
            int span = Math.min(64 - lo, to - i);
            long mask = span == 64 ? -1L : ((1L << span) - 1) << lo;
            words[base + w] |= mask;
            i += span;
        }
    }

    /** True if every bit in {@code [from, to)} is set (vacuously true for an empty range). */
    public static boolean allSet(long[] words, int base, int from, int to) {
        for (int i = from; i < to; ) {
            int w = i >>> 6;
            int lo = i & 63;
            int span = Math.min(64 - lo, to - i);
            long mask = span == 64 ? -1L : ((1L << span) - 1) << lo;
            if ((words[base + w] & mask) != mask) {
                return false;
            }
            i += span;
        }
        return true;
    }

    /** The first unset bit in {@code [from, to)}, or -1. */
    public static int firstUnset(long[] words, int base, int from, int to) {
        for (int i = from; i < to; i++) {
            if ((words[base + (i >>> 6)] & (1L << (i & 63))) == 0) {
                return i;
            }
        }
        return -1;
    }

    public static void clear(long[] words, int base, int count) {
        java.util.Arrays.fill(words, base, base + count, 0L);
    }
}
