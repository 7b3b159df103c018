package dev.kvshield.perf.fuzz;

import dev.kvshield.KvShieldException;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.lease.UnknownLeaseException;
import dev.kvshield.tenant.Owners;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The fuzz runner's reference model of one pool's holds: every lease the pool minted in the run,
 * with its page, tenant, holder and kind, and which of them ended. It is kept from what the runner
 * meant each call to do (a release ends the presented leases, an expiry fences the transfer's
 * claims), never read back from the pool, so the pool's holds can be compared with it after every
 * event; and it predicts how the pool must refuse a presented batch.
 *
 * <p>Id checks on every hand-out: each id is well formed, names the page it was handed out on, was
 * never handed out before, and every serial of a call lies above every serial handed out before it
 * and within the counter ({@link LeaseIds#maxSerial()}): ids never wrap.
 *
 * <p>Not thread-safe: the runner's thread only. Iteration orders are deterministic.
 */
final class LeaseModel {
    /** One hold as the model knows it. */
    record Hold(long id, int page, int tenant, long holder, LeaseKind kind, boolean fenced) {
        Hold fence() {
            return new Hold(id, page, tenant, holder, kind, true);
        }
    }

    /** What the pool must do with a presented batch: refuse it with one of {@code refusals}, or, when empty, accept it. */
    record Prediction(List<Class<? extends KvShieldException>> refusals, int badIndex, String why) {
        static final Prediction ACCEPT = new Prediction(List.of(), -1, "acceptable");

        boolean refused() {
            return !refusals.isEmpty();
        }

        boolean allows(Throwable t) {
            return refusals.stream().anyMatch(c -> c.isInstance(t));
        }
    }

    private final LeaseIds ids;
    private final Map<Long, Hold> live = new LinkedHashMap<>();
    private final Map<Long, Hold> ended = new LinkedHashMap<>();
    private final int[] lastGeneration;
    private long lastSerial;

    /** @param firstSerial the pool's first serial: every id below it counts as never minted */
    LeaseModel(LeaseIds ids, int pageCount, long firstSerial) {
        this.ids = ids;
        this.lastGeneration = new int[pageCount];
        this.lastSerial = firstSerial - 1;
    }

    LeaseIds ids() {
        return ids;
    }

    long lastSerial() {
        return lastSerial;
    }

    // ---------------------------------------------------------------- hand-outs and ends

    /**
     * Records the ids one call handed out, all to {@code (tenant, holder)} as {@code kind}, on
     * {@code pages[i]}; returns what is wrong with them (an {@code IDS} finding), or null.
     */
    String minted(long[] out, int offset, int count, int[] pages, int tenant, long holder, LeaseKind kind) {
        long floor = lastSerial;
        long top = lastSerial;
        for (int i = 0; i < count; i++) {
            long id = out[offset + i];
            if (!ids.isWellFormed(id)) {
                return "handed out " + ids.describe(id) + ", not an id this pool can mint";
            }
            if (ids.page(id) != pages[i]) {
                return "lease " + id + " names page " + ids.page(id) + " but was handed out on page " + pages[i];
            }
            if (live.containsKey(id) || ended.containsKey(id)) {
                return "lease " + id + " (page " + pages[i] + ") was handed out before: an id is never reused";
            }
            long serial = ids.serial(id);
            if (serial <= floor || serial > ids.maxSerial()) {
                return "lease " + id + " has serial " + serial + ", not above the last serial handed out before its call (" + floor
                        + ") and within the counter's end (" + ids.maxSerial() + "): ids wrapped or went back";
            }
            top = Math.max(top, serial);
        }
        for (int i = 0; i < count; i++) {
            long id = out[offset + i];
            live.put(id, new Hold(id, pages[i], tenant, holder, kind, false));
        }
        lastSerial = top;
        return null;
    }

    /** Records a page handed out (allocated or reclaimed) at {@code generation}; returns what is wrong, or null. */
    String handedOut(int page, int generation) {
        if (generation <= lastGeneration[page]) {
            return "page " + page + " handed out at generation " + generation + " after it was handed out at generation "
                    + lastGeneration[page] + ": generations only grow, never wrap";
        }
        lastGeneration[page] = generation;
        return null;
    }

    void end(long id) {
        Hold h = live.remove(id);
        if (h == null) {
            throw new IllegalStateException("the model ends lease " + id + ", which it does not hold live");
        }
        ended.put(id, h);
    }

    void fence(long id) {
        Hold h = live.get(id);
        if (h == null) {
            throw new IllegalStateException("the model fences lease " + id + ", which it does not hold live");
        }
        live.put(id, h.fence());
    }

    boolean isLive(long id) {
        return live.containsKey(id);
    }

    Hold live(long id) {
        return live.get(id);
    }

    /** Live holds in minting order. */
    List<Hold> liveHolds() {
        return List.copyOf(live.values());
    }

    /** Ended holds in ending order. */
    List<Hold> endedHolds() {
        return List.copyOf(ended.values());
    }

    /** Content holds on a page. */
    int contentHolds(int page) {
        int n = 0;
        for (Hold h : live.values()) {
            n += h.page() == page && h.kind().holdsContent() ? 1 : 0;
        }
        return n;
    }

    /** Claims, live or fenced, on a page. */
    int claims(int page) {
        int n = 0;
        for (Hold h : live.values()) {
            n += h.page() == page && h.kind().isClaim() ? 1 : 0;
        }
        return n;
    }

    // ---------------------------------------------------------------- predictions

    private static Prediction refuse(int i, String why, List<Class<? extends KvShieldException>> refusals) {
        return new Prediction(refusals, i, why);
    }

    /** A lease the presenter may not use: unknown, ended, another's, fenced, or of a kind {@code accept} does not take. */
    private Prediction checkUse(int i, long id, int tenant, long holder, Set<LeaseKind> accept, boolean claimsOnly) {
        if (!ids.isWellFormed(id)) {
            return refuse(i, ids.describe(id) + " is malformed", List.of(UnknownLeaseException.class));
        }
        Hold h = live.get(id);
        if (h == null) {
            if (ended.containsKey(id)) {
                return refuse(i, "lease " + id + " ended", List.of(ReleasedLeaseException.class));
            }
            // Below the last serial the model saw, an id it never saw was minted and ended inside one call (a
            // reservation refused after its allocation); above it, it may be that too, or never minted.
            return refuse(i, "lease " + id + " was never handed out", ids.serial(id) <= lastSerial
                    ? List.of(ReleasedLeaseException.class) : List.of(UnknownLeaseException.class, ReleasedLeaseException.class));
        }
        if (h.tenant() != tenant || h.holder() != holder || (claimsOnly && h.kind().holdsContent())) {
            return refuse(i, "lease " + id + " is a " + h.kind() + " of tenant " + h.tenant() + " " + Owners.describe(h.holder()),
                    List.of(ForeignLeaseException.class));
        }
        if (h.fenced() && !claimsOnly) {
            return refuse(i, "claim " + id + " is fenced", List.of(FencedLeaseException.class));
        }
        if (!accept.contains(h.kind())) {
            return refuse(i, "lease " + id + " is a " + h.kind(), List.of(ForeignLeaseException.class));
        }
        return null;
    }

    /**
     * How the pool must answer {@code call} presenting {@code batch[0, count)} as {@code (tenant,
     * holder)}, checked element by element in order as the pool does: the element's use, then
     * whether it was listed already, then (calls that make holds) whether its page was, and whether
     * the new holder holds the page already. Capacity and id exhaustion, checked after every
     * element, are not predicted here.
     */
    Prediction predict(BatchCall call, int tenant, long holder, long[] batch, int count) {
        Set<Long> seenIds = new HashSet<>();
        Set<Integer> seenPages = new HashSet<>();
        for (int i = 0; i < count; i++) {
            long id = batch[i];
            Prediction p = checkUse(i, id, tenant, holder, call.accepts(), call.takesClaims());
            if (p != null) {
                return p;
            }
            if (!seenIds.add(id)) {
                return refuse(i, "lease " + id + " is listed twice", List.of(DuplicateLeaseException.class));
            }
            int page = live.get(id).page();
            if (call.makesHolds()) {
                if (!seenPages.add(page)) {
                    return refuse(i, "page " + page + " is listed twice", List.of(DuplicateLeaseException.class));
                }
                if (call.newKind() != null && find(page, tenant, call.newHolder(), call.newKind()) != null) {
                    return refuse(i, "the new holder holds page " + page + " already", List.of(DuplicateLeaseException.class));
                }
            }
        }
        return Prediction.ACCEPT;
    }

    /** The live hold of {@code (tenant, holder)} on {@code page} of {@code kind}, or null. */
    Hold find(int page, int tenant, long holder, LeaseKind kind) {
        for (Hold h : live.values()) {
            if (h.page() == page && h.tenant() == tenant && h.holder() == holder && h.kind() == kind) {
                return h;
            }
        }
        return null;
    }

    /** Live holds of {@code (tenant, holder)} of the given kinds, in minting order. */
    List<Hold> heldBy(int tenant, long holder, Set<LeaseKind> kinds) {
        List<Hold> out = new ArrayList<>();
        for (Hold h : live.values()) {
            if (h.tenant() == tenant && h.holder() == holder && kinds.contains(h.kind())) {
                out.add(h);
            }
        }
        return out;
    }
}
