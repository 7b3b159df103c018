package dev.kvshield.internal;

/** A fixed-capacity stack of ints; the free list. Not thread-safe (guarded by the pool lock). */
public final class IntStack {
    private final int[] values;
    private int size;

    public IntStack(int capacity) {
        values = new int[capacity];
    }

    public void push(int v) {
        values[size++] = v;
    }

    public int pop() {
        return values[--size];
    }

    /** Pushes {@code src[offset, offset + count)} in order: as many {@link #push}es. */
    public void pushAll(int[] src, int offset, int count) {
        checkRoom(count);
        System.arraycopy(src, offset, values, size, count);
        size += count;
    }

    /** Pushes {@code src[offset, offset + count)} last first, so they pop in their order: as many {@link #push}es. */
    public void pushAllReversed(int[] src, int offset, int count) {
        checkRoom(count);
        for (int i = 0; i < count; i++) {
            values[size + i] = src[offset + count - 1 - i];
        }
        size += count;
    }

    private void checkRoom(int count) {
        if (count < 0 || count > values.length - size) {
            throw new IllegalStateException("push of " + count + " onto a stack of " + size + " of " + values.length);
        }
    }

    /** Pops the top {@code count} elements into {@code out[offset, offset + count)}, the top first: as many {@link #pop}s. */
    public void popInto(int count, int[] out, int offset) {
        if (count < 0 || count > size) {
            throw new IllegalStateException("pop of " + count + " from a stack of " + size);
        }
        for (int i = 0; i < count; i++) {
            out[offset + i] = values[size - 1 - i];
        }
        size -= count;
    }

    public int size() {
        return size;
    }

    /** Drops the top {@code n} elements. */
    public void drop(int n) {
        size -= n;
    }

    /** Removes one occurrence of {@code v} wherever it is, keeping the order of the rest; O(size). */
    public boolean remove(int v) {
        for (int i = size - 1; i >= 0; i--) {
            if (values[i] == v) {
                System.arraycopy(values, i + 1, values, i, size - 1 - i);
                size--;
                return true;
            }
        }
        return false;
    }

    public long digest(long h) {
        for (int i = 0; i < size; i++) {
            h = Digests.mix(h, values[i]);
        }
        return Digests.mix(h, size);
    }
}
