package dev.kvshield.audit.internal;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * Follows whose data each token slot of each page holds, from page events alone, and what every
 * request read. Used by the live trail (request summaries) and by the offline exposure query
 * replaying the records, so both judge exposure the same way.
 *
 * <p>A read of slot {@code s} of page {@code p} at generation {@code g} by tenant {@code T} is
 * <em>exposed</em> if the slot was not written in generation {@code g} (unwritten: it holds whatever
 * an earlier owner left), or was last written by another tenant; the writing tenant's data reached
 * the reader — unless the reader was granted the page ({@code READER_ADDED} of another tenant: an
 * operator's shared namespace), which is sharing, not exposure. A correct pool rejects exposure
 * before any byte moves; this tracker sees it only in a pool (or a replay of one) with an isolation bug.
 *
 * <p>In a trail without reads (an engine whose kernels read KV directly, {@code AuditConfig.readsRecorded}), a request is
 * taken to read each page as it is handed out: every slot another tenant wrote and no protection scrubbed is then
 * received foreign data ({@code foreignSlotsReceived}). Its own writes come after and clear nothing. A sealed page holds
 * ciphertext and is zeroed at any hand-out, so it passes on nobody's data; its sealer's reclaim restores what the seal
 * covered, the sealer's own slots and any another tenant left there, and is judged as a hand-out.
 *
 * <p>Not thread-safe: used under the trail's lock or by one reader.
 */
public final class ExposureTracker {
    private static final int NOBODY = -1;
    private static final PageEventType[] TYPES = PageEventType.values();
    private static final ProtectionLevel[] LEVELS = ProtectionLevel.values();

    private final int slotsPerPage;
    private final boolean readsRecorded;
    private final int[] writerTenant;
    private final int[] writerGeneration;
    private final int[] releasedByTenant;
    private final long[] releasedByOwner;
    /** Pages holding only a seal's ciphertext: the pool zeroes such a page at any hand-out, its owner's reclaim decrypts it. */
    private final boolean[] sealed;
    private final Map<Key, RequestState> requests = new HashMap<>();
    /** Readers of other tenants granted per page (shared namespaces), valid until the page's release; null if none. */
    private final List<Set<Key>> grants;
    /** The request of the last {@link #state} call: events of one request come in runs. */
    private RequestState last;
    /** Whether reads and hand-outs count for their request (a windowed query replays the rest for the slots only). */
    private boolean counting = true;

    /** A tenant's request (or cache namespace) as events name it. */
    public record Key(int tenant, long owner) {}

    /** What one request did, as far as the events show. */
    public static final class RequestState {
        public final Key key;
        /** {@code page << 32 | generation} of every page read, in first-read order. */
        public final LongOrderedSet pagesRead = new LongOrderedSet();
        /** Tenants whose data reached this request. */
        public final Set<Integer> sourceTenants = new TreeSet<>();
        /** Tenants whose shared-namespace pages this request read under a reader grant. */
        public final Set<Integer> sharedFrom = new TreeSet<>();
        public long foreignSlotReads;
        public long unwrittenSlotReads;
        /** In a trail without reads: slots of another tenant's unscrubbed data in pages handed to this request. */
        public long foreignSlotsReceived;
        public int rejections;
        public int verifyFailedPages;

        RequestState(Key key) {
            this.key = key;
        }

        public boolean exposed() {
            return foreignSlotReads > 0 || unwrittenSlotReads > 0 || foreignSlotsReceived > 0;
        }
    }

    /** @param readsRecorded whether the trail holds every read; if not, hand-outs are judged as reads (class notes) */
    public ExposureTracker(int pageCount, int slotsPerPage, boolean readsRecorded) {
        this.slotsPerPage = slotsPerPage;
        this.readsRecorded = readsRecorded;
        writerTenant = new int[pageCount * slotsPerPage];
        Arrays.fill(writerTenant, NOBODY);
        writerGeneration = new int[pageCount * slotsPerPage];
        releasedByTenant = new int[pageCount];
        Arrays.fill(releasedByTenant, NOBODY);
        releasedByOwner = new long[pageCount];
        Arrays.fill(releasedByOwner, Owners.NOBODY);
        sealed = new boolean[pageCount];
        grants = new ArrayList<>(Collections.nCopies(pageCount, null));
    }

    /**
     * Applies one event {@code times} times in a row (a record lists a page once with a count when
     * the same event repeats, e.g. a read of each of a page's buffers).
     *
     * @return for a read (and, in a trail without reads, a hand-out or reclaim), whether it was exposed; for {@code VERIFY_FAILED},
     *     whether a releasing request was found; false otherwise
     */
    public boolean apply(int typeOrdinal, int page, int generation, int tenant, long owner, long detail, int times) {
        PageEventType type = TYPES[typeOrdinal];
        if (type.isRejection()) {
            if (tenant >= 0 && Owners.isValid(owner)) {
                state(tenant, owner).rejections += times;
            }
            return false;
        }
        if (page < 0 || page >= releasedByTenant.length) {
            return false;
        }
        int base = page * slotsPerPage;
        switch (type) {
            case ALLOCATE -> {
                if (sealed[page]) { // NOTE: a sealed page is handed out only zeroed (HandOuts.clearSealedForHandOut), to anyone
                    sealed[page] = false;
                    Arrays.fill(writerTenant, base, base + slotsPerPage, NOBODY);
                }
                return !readsRecorded && received(base, tenant, owner);
            }
            case SEAL -> sealed[page] = true;
            case WRITE -> {
                int from = Math.max(0, (int) (detail >>> 32)); // NOTE: clamped: a replayed record's range is untrusted
                int to = Math.min((int) detail, slotsPerPage);
                for (int s = from; s < to; s++) {
                    writerTenant[base + s] = tenant;
                    writerGeneration[base + s] = generation;
                }
            }
            case READ -> {
                return read(base, page, generation, tenant, owner, detail, times);
            }
            case RECLAIM -> {
                // Decrypting in place restores exactly what this tenant left: its slots live on in the new generation.
                sealed[page] = false;
                for (int s = 0; s < slotsPerPage; s++) {
                    if (writerTenant[base + s] == tenant) {
                        writerGeneration[base + s] = generation;
                    }
                }
                // NOTE: and whatever another tenant left unscrubbed under the seal: a reclaim is a hand-out of the whole page
                return !readsRecorded && received(base, tenant, owner);
            }
            case PROTECT_DONE -> {
                if (detail >= 0 && detail < LEVELS.length && LEVELS[(int) detail].scrubsOnRelease()) {
                    Arrays.fill(writerTenant, base, base + slotsPerPage, NOBODY);
                }
            }
            case READER_ADDED -> {
                if (grants.get(page) == null) {
                    grants.set(page, new HashSet<>());
                }
                grants.get(page).add(new Key(tenant, detail));
            }
            case READER_REMOVED -> {
                Set<Key> g = grants.get(page);
                if (g != null) {
                    g.remove(new Key(tenant, detail));
                }
            }
            case RELEASE -> {
                grants.set(page, null);
                releasedByTenant[page] = tenant;
                releasedByOwner[page] = owner;
            }
            case VERIFY_FAILED -> {
                if (releasedByTenant[page] >= 0 && Owners.isValid(releasedByOwner[page])) {
                    state(releasedByTenant[page], releasedByOwner[page]).verifyFailedPages += times;
                    return true;
                }
            }
            default -> { }
        }
        return false;
    }

    private boolean read(int base, int page, int generation, int tenant, long owner, long detail, int times) {
        if (!counting || tenant < 0 || !Owners.isValid(owner)) {
            return false;
        }
        RequestState r = state(tenant, owner);
        r.pagesRead.add(((long) page << 32) | (generation & 0xFFFF_FFFFL));
        int from = Math.max(0, (int) (detail >>> 32));
        int to = Math.min((int) detail, slotsPerPage);
        boolean exposed = false;
        Set<Key> granted = grants.get(page);
        boolean shared = granted != null && granted.contains(new Key(tenant, owner));
        for (int s = from; s < to; s++) {
            int writer = writerTenant[base + s];
            if (writer == NOBODY || writerGeneration[base + s] != generation) {
                r.unwrittenSlotReads += times;
                exposed = true;
            } else if (writer != tenant && shared) {
                r.sharedFrom.add(writer);
                continue;
            } else if (writer != tenant) {
                r.foreignSlotReads += times;
                exposed = true;
            }
            if (writer != NOBODY && writer != tenant) {
                r.sourceTenants.add(writer);
            }
        }
        return exposed;
    }

    /** A hand-out in a trail without reads: another tenant's slots left in the page reach its new owner. */
    private boolean received(int base, int tenant, long owner) {
        if (!counting || tenant < 0 || !Owners.isValid(owner)) {
            return false;
        }
        RequestState r = null;
        for (int s = base; s < base + slotsPerPage; s++) {
            int writer = writerTenant[s];
            if (writer != NOBODY && writer != tenant) {
                r = r == null ? state(tenant, owner) : r;
                r.foreignSlotsReceived++;
                r.sourceTenants.add(writer);
            }
        }
        return r != null;
    }

    /**
     * Whether the reads and hand-outs applied next count for their requests (true at first): a query over a time window
     * replays the events outside it for whose data each slot holds only, so a request's counts and source tenants are
     * what reached it inside the window.
     */
    public void counting(boolean counting) {
        this.counting = counting;
    }

    /** The tenant whose release put the page into its current protection, or -1. */
    public int releasedByTenant(int page) {
        return releasedByTenant[page];
    }

    /** The owner whose release put the page into its current protection, or {@link Owners#NOBODY}. */
    public long releasedByOwner(int page) {
        return releasedByOwner[page];
    }

    private RequestState state(int tenant, long owner) {
        RequestState r = last;
        if (r == null || r.key.tenant() != tenant || r.key.owner() != owner) {
            r = requests.computeIfAbsent(new Key(tenant, owner), RequestState::new);
            last = r;
        }
        return r;
    }

    /** Removes and returns a request's state, or null if it left no trace (read, rejection or verify failure). */
    public RequestState finish(int tenant, long owner) {
        RequestState r = requests.remove(new Key(tenant, owner));
        if (r == last) {
            last = null;
        }
        return r;
    }

    /** Requests not finished yet (offline: requests without a summary record). */
    public Iterable<RequestState> unfinished() {
        return requests.values();
    }
}
