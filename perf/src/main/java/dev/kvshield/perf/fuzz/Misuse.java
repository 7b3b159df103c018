package dev.kvshield.perf.fuzz;

import java.util.ArrayList;
import java.util.List;

/**
 * A hostile batch a request presents ({@code misuse ID V}): which call, which flawed id, and where
 * in the batch it goes among the request's own good leases for that call. Every batch is refused by
 * construction: when the flawed id happens to be good (an id of another pool that equals one of the
 * request's own), a malformed id follows it.
 *
 * @param position where the flawed id goes, modulo the batch's length plus one
 */
record Misuse(BatchCall call, Flaw flaw, int position) {
    /** How the hostile id is wrong. */
    enum Flaw {
        /** One of the batch's own ids, listed again. */
        DUPLICATE,
        /** A live lease of another tenant. */
        FOREIGN_TENANT,
        /** A live lease of another holder of the same tenant (another request, the cache namespace). */
        FOREIGN_HOLDER,
        /** A lease that ended (released, transferred, dropped). */
        RELEASED,
        /** A well-formed id the pool never minted. */
        NEVER_MINTED,
        /** Not an id this pool can mint (0, negative). */
        MALFORMED,
        /** A lease of another pool: the same bits may name a lease of this one (a collision). */
        OTHER_POOL,
        /** The presenter's own lease of a kind the call does not take (a claim to release, a reader to share). */
        WRONG_KIND
    }

    static final int POSITIONS = 8;
    private static final BatchCall[] CALLS = {BatchCall.RELEASE, BatchCall.CHECK_HELD, BatchCall.SHARE, BatchCall.TRANSFER,
        BatchCall.CLAIM, BatchCall.DROP_CLAIMS, BatchCall.FENCE_CLAIMS, BatchCall.WRITE, BatchCall.READ, BatchCall.WRITE_ALL_BUFFERS,
        BatchCall.READ_ALL_BUFFERS};
    private static final Flaw[] FLAWS = Flaw.values();
    /** Distinct misuse arguments: every call x flaw x position. */
    static final int VARIANTS = CALLS.length * FLAWS.length * POSITIONS;

    static Misuse decode(int arg) {
        int v = Math.floorMod(arg, VARIANTS);
        return new Misuse(CALLS[v / (FLAWS.length * POSITIONS)], FLAWS[v / POSITIONS % FLAWS.length], v % POSITIONS);
    }

    /** What a runner knows when it builds the batch. */
    interface Ids {
        LeaseModel model();

        /** Leases of another pool (of the same geometry and first serial), live and ended. */
        long[] otherPool();

        /** Whether the pool's counter cannot have reached its end (NEVER_MINTED may then use the last serial). */
        boolean farFromTheEnd();
    }

    /** The batch {@code (tenant, holder)} presents, its flawed id included. */
    long[] batch(Ids known, int tenant, long holder) {
        LeaseModel model = known.model();
        boolean single = call.presentsOne();
        List<Long> good = new ArrayList<>();
        for (LeaseModel.Hold h : model.heldBy(tenant, holder, call.accepts())) {
            if (call.takesClaims() || !h.fenced()) {
                good.add(h.id());
            }
        }
        List<Long> batch = single ? new ArrayList<>() : new ArrayList<>(good.subList(0, Math.min(4, good.size())));
        long bad = flawed(known, tenant, holder, batch);
        batch.add(Math.floorMod(position, batch.size() + 1), bad);
        long[] out = batch.stream().mapToLong(Long::longValue).toArray();
        if (!model.predict(call, tenant, holder, out, out.length).refused()) {
            out = single ? new long[] {0L} : java.util.Arrays.copyOf(out, out.length + 1); // appends 0: malformed
        }
        return out;
    }

    private long flawed(Ids known, int tenant, long holder, List<Long> batch) {
        LeaseModel model = known.model();
        List<LeaseModel.Hold> live = model.liveHolds();
        long fallback = position % 2 == 0 ? 0L : -1L - position;
        return switch (flaw) {
            case DUPLICATE -> batch.isEmpty() ? fallback : batch.get(position % batch.size());
            case FOREIGN_TENANT -> pick(live.stream().filter(h -> h.tenant() != tenant).toList(), fallback);
            case FOREIGN_HOLDER -> pick(live.stream().filter(h -> h.tenant() == tenant && h.holder() != holder).toList(), fallback);
            case RELEASED -> pick(model.endedHolds(), fallback);
            case NEVER_MINTED -> {
                long serial = known.farFromTheEnd() ? model.ids().maxSerial() - position
                        : Math.min(model.ids().maxSerial(), model.lastSerial() + 1 + position);
                yield model.ids().encode(serial, 0); // page 0 is reserved, but a page every id can name
            }
            case MALFORMED -> fallback;
            case OTHER_POOL -> {
                long[] other = known.otherPool();
                yield other.length == 0 ? fallback : other[position % other.length];
            }
            case WRONG_KIND -> pick(live.stream().filter(h -> h.tenant() == tenant && h.holder() == holder
                    && !call.accepts().contains(h.kind())).toList(), fallback);
        };
    }

    private long pick(List<LeaseModel.Hold> holds, long fallback) {
        return holds.isEmpty() ? fallback : holds.get(position % holds.size()).id();
    }

    @Override
    public String toString() {
        return call + " with a " + flaw + " id at position " + position;
    }
}
