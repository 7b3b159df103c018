package dev.kvshield.lifecycle;

import dev.kvshield.internal.Digests;
import dev.kvshield.internal.IntStack;
import java.util.Arrays;

/**
 * The page table every part of a pool shares: each page's state, generation and tenant, pages
 * owned per tenant, and the free list. State changes go through
 * {@link PageLifecycle}, so a transition the table forbids is a kvshield bug that throws, never a
 * silent corruption.
 *
 * <p>Not thread-safe: guarded by the pool lock. Used only by the pool's parts (ModuleBoundariesTest
 * keeps it inside allocator-api).
 *
 * <p>Implementation notes: parallel primitive arrays indexed by page. The free list is a stack
 * whose top is the next page handed out, so a released batch is reused first and in its own order
 * (SGLang prepends freed pages the same way). A reserved page 0 is held RETIRED so no path can hand
 * it out; {@link #count} leaves it out. No per-state counters: {@link #move} runs once per page per
 * transition on every hot path, where two counter updates cost more than the state write itself (each a
 * read-modify-write the next page's waits on); {@link #count} scans the states instead (diagnostics only).
 */
public final class PageTable {
    private static final PageState[] STATES = PageState.values();

    private final byte[] state;
    private final int[] generation;
    private final int[] tenant;
    private final IntStack free;
    private final int reservedPages;
    private int[] ownedByTenant = new int[0];

    /** Every usable page FREE at {@code initialGeneration}, pushed so the lowest page is handed out first. */
    public PageTable(int pageCount, int initialGeneration, boolean pageZeroReserved) {
        state = new byte[pageCount];
        generation = new int[pageCount];
        Arrays.fill(generation, initialGeneration);
        tenant = new int[pageCount];
        Arrays.fill(tenant, -1);
        free = new IntStack(pageCount);
        reservedPages = pageZeroReserved ? 1 : 0;
        for (int p = pageCount - 1; p >= reservedPages; p--) {
            free.push(p);
        }
        if (pageZeroReserved) {
            state[0] = (byte) PageState.RETIRED.ordinal();
        }
    }

    public int pageCount() {
        return state.length;
    }

    public PageState state(int page) {
        return STATES[state[page]];
    }

    public boolean is(int page, PageState s) {
        return state[page] == s.ordinal();
    }

    /** Moves a page along {@code transition}; throws {@link IllegalStateException} if the table forbids it. */
    public void move(int page, PageTransition transition) {
        state[page] = PageLifecycle.nextOrdinal(state[page], transition, page);
    }

    /** Hands {@code page} out to tenant {@code t}, as {@link #move} (ALLOCATE) and {@link #setTenant} would; returns its generation. */
    public int handOut(int page, int t) {
        state[page] = PageLifecycle.nextOrdinal(state[page], PageTransition.ALLOCATE, page);
        tenant[page] = t;
        return generation[page];
    }

    /** The tenant of every page of {@code pages[offset, offset + count)} when they have one and the same, else -1 (also for none). */
    public int commonTenant(int[] pages, int offset, int count) {
        int t = count == 0 ? -1 : tenant[pages[offset]];
        for (int i = offset + 1; i < offset + count && t >= 0; i++) {
            t = tenant[pages[i]] == t ? t : -1;
        }
        return t;
    }

    public int generation(int page) {
        return generation[page];
    }

    /** Moves the page to its next generation and returns it; every lease and handle of the old one is stale from now on. */
    public int bumpGeneration(int page) {
        return ++generation[page];
    }

    /** The page's tenant while OWNED, its last owner's while QUARANTINED; -1 otherwise. */
    public int tenant(int page) {
        return tenant[page];
    }

    public void setTenant(int page, int t) {
        tenant[page] = t;
    }

    /** Pages in state {@code s}, the reserved page 0 left out. O(pages): for snapshots and gauges, not hot paths. */
    public int count(PageState s) {
        int n = 0;
        for (byte b : state) {
            n += b == s.ordinal() ? 1 : 0;
        }
        return n - (s == PageState.RETIRED ? reservedPages : 0);
    }

    public int freeCount() {
        return free.size();
    }

    /** Pops the next {@code count} pages of the free list into {@code out[offset, offset + count)} in hand-out order. */
    public void popFree(int count, int[] out, int offset) {
        free.popInto(count, out, offset);
    }

    /** Pushes {@code pages[0, count)} onto the free list so they are handed out in that order (pushed last first). */
    public void pushFreeInOrder(int[] pages, int count) {
        free.pushAllReversed(pages, 0, count);
    }

    /** Pages OWNED with tenant {@code t} (quota accounting). */
    public int ownedBy(int t) {
        return t < ownedByTenant.length ? ownedByTenant[t] : 0;
    }

    public void addOwned(int t, int delta) {
        if (delta == 0) {
            return;
        }
        if (t >= ownedByTenant.length) {
            ownedByTenant = Arrays.copyOf(ownedByTenant, Math.max(t + 1, ownedByTenant.length * 2));
        }
        ownedByTenant[t] += delta;
    }

    public long digest(long h) {
        for (int p = 0; p < state.length; p++) {
            h = Digests.mix(h, state[p]);
            h = Digests.mix(h, generation[p]);
            h = Digests.mix(h, tenant[p]);
        }
        for (int t = 0; t < ownedByTenant.length; t++) {
            if (ownedByTenant[t] != 0) { // the array's length is storage, not state
                h = Digests.mix(h, t * 0x1_0000_0000L + ownedByTenant[t]);
            }
        }
        return free.digest(h);
    }
}
