package dev.kvshield.audit.internal;

import java.util.Arrays;
import java.util.function.LongSupplier;

/**
 * The audit trail's buffer of one step's events, grouped into runs: a run is one record to be
 * written, a list of pages ({@code [page, generation, times]} entries) that share everything else
 * (type, tenant, owner, detail, claim kind and peer). The pool emits a batch call's events page by
 * page, and a batch often emits several types in lockstep (protect-done then free, page after
 * page); each event joins the open run of its kind, so a batch of {@code n} pages becomes one run
 * per type instead of {@code n} records each.
 *
 * <p>The order the runs give back, runs in creation order and entries in order within each, keeps
 * every page's own events in the order they happened: an event joins an open run only if no run
 * opened after that one holds the same page; otherwise every open run is closed and the event
 * starts a new one. Events of different pages in one step may come back in another interleaving
 * (the pool emits them under one lock; nothing reads meaning into it). A repeat of the run's last
 * entry (same page and generation, e.g. one read per buffer of a page) adds to its count.
 * Events that may not join ({@code joinable} false) or name no page of the pool stand alone and
 * close the open runs before and after them.
 *
 * <p>Not thread-safe: used under the trail's lock. Adding allocates nothing.
 *
 * <p>Implementation notes: runs and entries live in primitive arrays of {@code capacity} each; a
 * run's entries are linked ({@link #next}) because runs fill in lockstep. At most
 * {@value #MAX_OPEN_RUNS} runs are open; a new run beyond that closes the others. Per page,
 * {@code newestRun} holds the serial number of the newest run that lists it; serials run on across
 * {@link #clear()}, so nothing is reset per step, and are compared by subtraction: after 2^31 runs a
 * stale serial can only look newer, which closes runs early (a record more) and never reorders.
 */
public final class EventRuns {
    /** Open runs an event may join; a lockstep batch emits a handful of types per page. */
    static final int MAX_OPEN_RUNS = 8;

    private final LongSupplier monoClockNanos;
    private final int pageCount;
    // Runs, by index in [0, runs).
    private final byte[] type;
    private final int[] tenant;
    private final long[] owner;
    private final long[] detail;
    private final byte[] kind;
    private final long[] peer;
    private final long[] monoNanos;
    private final long[] step;
    private final int[] first;
    private final int[] last;
    private final boolean[] alone;
    /** The engine's name for a run's request, or null; only a labelled run ({@link #addLabelled}) has one. */
    private final String[] label;
    /** Whether a run before {@link #runs} has a label: {@link #clear()} then drops the references. */
    private boolean labelled;
    // Entries, by index in [0, entries).
    private final int[] page;
    private final int[] generation;
    private final int[] times;
    private final int[] next;
    /** Per page: serial of the newest run listing it. */
    private final int[] newestRun;
    private int runs;
    private int entries;
    /** Runs before this index are closed. */
    private int openFrom;
    /** Serial of run 0 of the buffer. */
    private int serialBase = 1;
    /** The run the last event joined or opened; the likeliest one for the next. */
    private int lastRun = -1;
    /**
     * The entry the last joinable event went to, or -1, and that event: an exact repeat (a read of
     * each buffer of a page) only counts (it lands right after its twin, so no order can change).
     */
    private int repeatEntry = -1;
    private byte repeatType;
    private int repeatPage;
    private int repeatGeneration;
    private int repeatTenant;
    private long repeatOwner;
    private long repeatDetail;
    private byte repeatKind;
    private long repeatPeer;

    /**
     * @param capacity runs and entries held before the caller must {@link #clear()}
     * @param pageCount pages of the pool; events of other page numbers stand alone
     * @param monoClockNanos read once per run: a run's time is its first event's
     */
    public EventRuns(int capacity, int pageCount, LongSupplier monoClockNanos) {
        this.monoClockNanos = monoClockNanos;
        this.pageCount = pageCount;
        type = new byte[capacity];
        tenant = new int[capacity];
        owner = new long[capacity];
        detail = new long[capacity];
        kind = new byte[capacity];
        peer = new long[capacity];
        monoNanos = new long[capacity];
        step = new long[capacity];
        first = new int[capacity];
        last = new int[capacity];
        alone = new boolean[capacity];
        label = new String[capacity];
        page = new int[capacity];
        generation = new int[capacity];
        times = new int[capacity];
        next = new int[capacity];
        newestRun = new int[pageCount];
    }

    /**
     * Adds one event.
     *
     * @param joinable whether it may share a record with like events (false: a record of its own)
     * @return true if the buffer is full: the caller must drain it and {@link #clear()} before the next add
     */
    public boolean add(byte eventType, boolean joinable, int eventPage, int eventGeneration, int eventTenant, long eventOwner,
            long eventDetail, byte eventKind, long eventPeer, long atStep) {
        if (repeatEntry >= 0 && eventPage == repeatPage && eventGeneration == repeatGeneration && eventType == repeatType
                && eventDetail == repeatDetail && eventOwner == repeatOwner && eventTenant == repeatTenant && eventKind == repeatKind
                && eventPeer == repeatPeer && joinable && times[repeatEntry] < Integer.MAX_VALUE) {
            times[repeatEntry]++;
            return false;
        }
        boolean hasPage = eventPage >= 0 && eventPage < pageCount;
        if (joinable && hasPage) {
            int r = find(eventType, eventTenant, eventOwner, eventDetail, eventKind, eventPeer);
            if (r >= 0) {
                int newest = newestRun[eventPage];
                int serial = serialBase + r;
                if (newest - serial <= 0 || newest - (serialBase + openFrom) < 0) {
                    append(r, eventPage, eventGeneration);
                    newestRun[eventPage] = serial;
                    lastRun = r;
                    remember(last[r], eventType, eventPage, eventGeneration, eventTenant, eventOwner, eventDetail, eventKind, eventPeer);
                    return full();
                }
                openFrom = runs; // a later open run lists this page: close them all
            }
        }
        if (!joinable || !hasPage || runs - openFrom >= MAX_OPEN_RUNS) {
            openFrom = runs;
        }
        int r = runs++;
        type[r] = eventType;
        tenant[r] = eventTenant;
        owner[r] = eventOwner;
        detail[r] = eventDetail;
        kind[r] = eventKind;
        peer[r] = eventPeer;
        monoNanos[r] = monoClockNanos.getAsLong();
        step[r] = atStep;
        alone[r] = !joinable || !hasPage;
        int e = newEntry(eventPage, eventGeneration);
        first[r] = e;
        last[r] = e;
        if (alone[r]) {
            openFrom = runs;
            lastRun = -1;
            repeatEntry = -1;
        } else {
            newestRun[eventPage] = serialBase + r;
            lastRun = r;
            remember(e, eventType, eventPage, eventGeneration, eventTenant, eventOwner, eventDetail, eventKind, eventPeer);
        }
        return full();
    }

    /**
     * Adds an event that names no page and stands alone (a request's summary), carrying
     * {@code runLabel} (null: none).
     *
     * @return as {@link #add}
     */
    public boolean addLabelled(byte eventType, int eventTenant, long eventOwner, long eventDetail, String runLabel, long atStep) {
        boolean full = add(eventType, false, -1, 0, eventTenant, eventOwner, eventDetail, (byte) -1, 0, atStep);
        if (runLabel != null) {
            label[runs - 1] = runLabel;
            labelled = true;
        }
        return full;
    }

    private void remember(int entry, byte eventType, int eventPage, int eventGeneration, int eventTenant, long eventOwner,
            long eventDetail, byte eventKind, long eventPeer) {
        repeatEntry = entry;
        repeatType = eventType;
        repeatPage = eventPage;
        repeatGeneration = eventGeneration;
        repeatTenant = eventTenant;
        repeatOwner = eventOwner;
        repeatDetail = eventDetail;
        repeatKind = eventKind;
        repeatPeer = eventPeer;
    }

    private boolean full() {
        return runs == type.length || entries == page.length;
    }

    /** The open run of this kind, or -1. */
    private int find(byte eventType, int eventTenant, long eventOwner, long eventDetail, byte eventKind, long eventPeer) {
        if (lastRun >= openFrom && matches(lastRun, eventType, eventTenant, eventOwner, eventDetail, eventKind, eventPeer)) {
            return lastRun;
        }
        for (int r = runs - 1; r >= openFrom; r--) {
            if (matches(r, eventType, eventTenant, eventOwner, eventDetail, eventKind, eventPeer)) {
                return r;
            }
        }
        return -1;
    }

    private boolean matches(int r, byte eventType, int eventTenant, long eventOwner, long eventDetail, byte eventKind, long eventPeer) {
        return type[r] == eventType && detail[r] == eventDetail && owner[r] == eventOwner && tenant[r] == eventTenant
                && kind[r] == eventKind && peer[r] == eventPeer && !alone[r];
    }

    private void append(int r, int eventPage, int eventGeneration) {
        int l = last[r];
        if (page[l] == eventPage && generation[l] == eventGeneration && times[l] < Integer.MAX_VALUE) {
            times[l]++;
            return;
        }
        int e = newEntry(eventPage, eventGeneration);
        next[l] = e;
        last[r] = e;
    }

    private int newEntry(int eventPage, int eventGeneration) {
        int e = entries++;
        page[e] = eventPage;
        generation[e] = eventGeneration;
        times[e] = 1;
        next[e] = -1;
        return e;
    }

    /** Forgets every run (after they were written); page order bookkeeping carries on. */
    public void clear() {
        if (labelled) {
            Arrays.fill(label, 0, runs, null);
            labelled = false;
        }
        serialBase += runs;
        runs = 0;
        entries = 0;
        openFrom = 0;
        lastRun = -1;
        repeatEntry = -1;
    }

    public int runs() {
        return runs;
    }

    public byte type(int run) {
        return type[run];
    }

    public int tenant(int run) {
        return tenant[run];
    }

    public long owner(int run) {
        return owner[run];
    }

    public long detail(int run) {
        return detail[run];
    }

    /** The claim kind's ordinal, or -1 for an event that came without one. */
    public byte kind(int run) {
        return kind[run];
    }

    public long peer(int run) {
        return peer[run];
    }

    /** The run's label ({@link #addLabelled}), or null. */
    public String label(int run) {
        return label[run];
    }

    public long monoNanos(int run) {
        return monoNanos[run];
    }

    public long step(int run) {
        return step[run];
    }

    /** The run's first entry. */
    public int first(int run) {
        return first[run];
    }

    /** The entry after {@code entry} in its run, or -1. */
    public int next(int entry) {
        return next[entry];
    }

    public int page(int entry) {
        return page[entry];
    }

    public int generation(int entry) {
        return generation[entry];
    }

    /** How many times the event repeated on this page and generation, in a row; at least 1. */
    public int times(int entry) {
        return times[entry];
    }
}
