package dev.kvshield.audit.internal;

import java.util.Arrays;

/**
 * A set of {@code long}s that remembers insertion order, without boxing: adding a value already
 * present allocates nothing (a request reads the same pages every step).
 *
 * <p>Not thread-safe.
 *
 * <p>Implementation notes: values in insertion order in {@link #values}; an open-addressing table
 * of their indices plus one (0 = empty), linear probing, kept at most half full.
 */
public final class LongOrderedSet {
    private long[] values = new long[8];
    private int[] slots = new int[16];
    private int size;

    /** Adds {@code v}; returns false if it was present. */
    public boolean add(long v) {
        int mask = slots.length - 1;
        for (int i = mix(v) & mask; ; i = (i + 1) & mask) {
            int at = slots[i];
            if (at == 0) {
                if (size == values.length) {
                    values = Arrays.copyOf(values, 2 * size);
                }
                values[size++] = v;
                slots[i] = size;
                if (2 * size > slots.length) {
                    rehash();
                }
                return true;
            }
            if (values[at - 1] == v) {
                return false;
            }
        }
    }

    public int size() {
        return size;
    }

    /** The {@code i}-th value added, {@code 0 <= i < size()}. */
    public long get(int i) {
        if (i < 0 || i >= size) {
            throw new IndexOutOfBoundsException("index " + i + " of a set of " + size);
        }
        return values[i];
    }

    private void rehash() {
        slots = new int[2 * slots.length];
        int mask = slots.length - 1;
        for (int k = 0; k < size; k++) {
            int i = mix(values[k]) & mask;
            while (slots[i] != 0) {
                i = (i + 1) & mask;
            }
            slots[i] = k + 1;
        }
    }

    private static int mix(long v) {
        long h = v * 0x9E37_79B9_7F4A_7C15L;
        return (int) (h ^ (h >>> 32));
    }
}
