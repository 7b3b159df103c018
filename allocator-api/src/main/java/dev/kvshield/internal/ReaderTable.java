package dev.kvshield.internal;

import dev.kvshield.KvShieldException;

/**
 * Readers of each page: (tenant, request) pairs allowed to read it, kept as short linked
 * lists in preallocated node arrays so adding, checking and clearing do not allocate. Not
 * thread-safe (guarded by the pool lock).
 */
public final class ReaderTable {
    private static final int NIL = -1;
    private final int[] headByPage;
    private final int[] nodeTenant;
    private final long[] nodeRequest;
    private final int[] nodeNext;
    private int freeNode;
    private int used;

    public ReaderTable(int pageCount, int capacity) {
        headByPage = new int[pageCount];
        java.util.Arrays.fill(headByPage, NIL);
        nodeTenant = new int[capacity];
        nodeRequest = new long[capacity];
        nodeNext = new int[capacity];
        for (int i = 0; i < capacity; i++) {
            nodeNext[i] = i + 1 < capacity ? i + 1 : NIL;
        }
        freeNode = capacity > 0 ? 0 : NIL;
    }

    public boolean contains(int page, int tenant, long request) {
        for (int n = headByPage[page]; n != NIL; n = nodeNext[n]) {
            if (nodeRequest[n] == request && nodeTenant[n] == tenant) {
                return true;
            }
        }
        return false;
    }

    /** Adds a reader; a reader already present is kept once. */
    public void add(int page, int tenant, long request) {
        if (contains(page, tenant, request)) {
            return;
        }
        if (freeNode == NIL) {
            throw new KvShieldException("reader table full: " + nodeRequest.length + " readers registered; raise maxReaders");
        }
        int n = freeNode;
        freeNode = nodeNext[n];
        nodeTenant[n] = tenant;
        nodeRequest[n] = request;
        nodeNext[n] = headByPage[page];
        headByPage[page] = n;
        used++;
    }

    public boolean remove(int page, int tenant, long request) {
        int prev = NIL;
        for (int n = headByPage[page]; n != NIL; prev = n, n = nodeNext[n]) {
            if (nodeRequest[n] == request && nodeTenant[n] == tenant) {
                if (prev == NIL) {
                    headByPage[page] = nodeNext[n];
                } else {
                    nodeNext[prev] = nodeNext[n];
                }
                nodeNext[n] = freeNode;
                freeNode = n;
                used--;
                return true;
            }
        }
        return false;
    }

    /** Drops every reader of a page (its generation moved on). */
    public void clear(int page) {
        int n = headByPage[page];
        while (n != NIL) {
            int next = nodeNext[n];
            nodeNext[n] = freeNode;
            freeNode = n;
            used--;
            n = next;
        }
        headByPage[page] = NIL;
    }

    public int used() {
        return used;
    }

    public long digest(long h, int page) {
        long sum = 0;
        for (int n = headByPage[page]; n != NIL; n = nodeNext[n]) {
            sum += Digests.mix(nodeTenant[n], nodeRequest[n]);
        }
        return Digests.mix(h, sum);
    }
}
