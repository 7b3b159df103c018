package dev.kvshield.seal;

import dev.kvshield.internal.Digests;

/**
 * A doubly linked list over page indices: the sealed pages in release order, oldest first, with
 * O(1) removal from the middle (a reclaim). Not thread-safe (guarded by the pool lock).
 */
final class PageLru {
    private static final int NIL = -1;
    private final int[] prev;
    private final int[] next;
    private final boolean[] linked;
    private int head = NIL;
    private int tail = NIL;
    private int size;

    PageLru(int pageCount) {
        prev = new int[pageCount];
        next = new int[pageCount];
        linked = new boolean[pageCount];
    }

    void addLast(int page) {
        prev[page] = tail;
        next[page] = NIL;
        if (tail == NIL) {
            head = page;
        } else {
            next[tail] = page;
        }
        tail = page;
        linked[page] = true;
        size++;
    }

    void remove(int page) {
        if (!linked[page]) {
            return;
        }
        int p = prev[page];
        int n = next[page];
        if (p == NIL) {
            head = n;
        } else {
            next[p] = n;
        }
        if (n == NIL) {
            tail = p;
        } else {
            prev[n] = p;
        }
        linked[page] = false;
        size--;
    }

    /** The oldest page, or -1. */
    int first() {
        return head;
    }

    /** The page after {@code page} in release order, or -1. */
    int after(int page) {
        return next[page];
    }

    int size() {
        return size;
    }

    long digest(long h) {
        for (int p = head; p != NIL; p = next[p]) {
            h = Digests.mix(h, p);
        }
        return Digests.mix(h, size);
    }
}
