package dev.kvshield.perf.fuzz;

import dev.kvshield.KvShieldException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseIdsExhaustedException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.perf.simulate.ResidueOracle;
import dev.kvshield.pool.KvPagePool;
import java.lang.foreign.MemorySegment;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.Supplier;

/**
 * The lease oracles of one trace run, over its {@link LeaseModel}:
 *
 * <ul>
 *   <li><b>ids</b> ({@code IDS}): every id handed out is fresh, in order and within the counter;
 *       every page is handed out at a generation above the last it had;
 *   <li><b>holds</b> ({@code HOLDS}): after every event each page's content holds and claims, and
 *       the liveness of every lease, are the model's;
 *   <li><b>refusals</b> ({@code REFUSAL}): a hostile batch is refused with the exception the contract
 *       names for its first bad id;
 *   <li><b>all or nothing</b> ({@code ATOMICITY}): a refused call (hostile, or out of ids) leaves the
 *       pool's state digest as it was;
 *   <li><b>failed protection</b> ({@code INVARIANT}, {@code RESIDUE}): a page whose protection failed
 *       (a faulted scrub or seal, an unseal that failed in the middle of a reclaim) never comes back
 *       into circulation, and once retired holds only zeros.
 * </ul>
 *
 * <p>Not thread-safe, except {@link #protectionFailed}, which page events may call from the pool's
 * protection worker.
 */
final class LeaseOracles {
    /** Records a finding and stops the run (a model that diverged makes every later check noise). */
    interface Sink {
        RuntimeException fail(Finding.Kind kind, int request, String message);
    }

    private final KvPagePool pool;
    private final LeaseModel model;
    private final Rig rig;
    private final ResidueOracle residue;
    private final Sink sink;
    private final Supplier<MemorySegment> data;
    /** Pages whose protection failed, until they are seen retired and zero. */
    private final Set<Integer> failedPages = new TreeSet<>();
    /** Every page whose protection ever failed: none is handed out again. */
    private final Set<Integer> everFailed = new TreeSet<>();
    private int refusals;
    private int exhaustions;

    LeaseOracles(KvPagePool pool, LeaseModel model, Rig rig, ResidueOracle residue, Sink sink, Supplier<MemorySegment> data) {
        this.pool = pool;
        this.model = model;
        this.rig = rig;
        this.residue = residue;
        this.sink = sink;
        this.data = data;
    }

    LeaseModel model() {
        return model;
    }

    /** Hostile batches refused as the contract says. */
    int refusals() {
        return refusals;
    }

    /** Calls refused because the lease ids or the claim slots ran out, leaving the pool as it was. */
    int exhaustions() {
        return exhaustions;
    }

    // ---------------------------------------------------------------- ids

    /**
     * Records leases one call handed to {@code (tenant, holder)}; {@code handOut} when the call
     * handed pages out (allocate, reclaim, reserve), whose generations must then grow.
     */
    void minted(long[] out, int offset, int count, int tenant, long holder, LeaseKind kind, boolean handOut, int request) {
        int[] pages = new int[count];
        for (int i = 0; i < count; i++) {
            pages[i] = pool.view().pageOf(out[offset + i]);
        }
        String wrong = model.minted(out, offset, count, pages, tenant, holder, kind);
        if (wrong != null) {
            throw sink.fail(Finding.Kind.IDS, request, wrong);
        }
        for (int i = 0; handOut && i < count; i++) {
            wrong = model.handedOut(pages[i], PageHandles.generation(pool.view().handleOf(out[offset + i])));
            if (wrong != null) {
                throw sink.fail(Finding.Kind.IDS, request, wrong);
            }
        }
    }

    void minted(long lease, int tenant, long holder, LeaseKind kind, boolean handOut, int request) {
        minted(new long[] {lease}, 0, 1, tenant, holder, kind, handOut, request);
    }

    void end(long[] ids, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            model.end(ids[i]);
        }
    }

    // ---------------------------------------------------------------- refusals

    /** A call the pool may refuse for want of lease ids or claim slots; it must then leave the pool as it was. */
    interface Minting {
        void run();
    }

    /**
     * Runs a call that mints leases; if the pool refuses it because its ids or its claim slots ran
     * out, checks the refusal left the pool as it was.
     *
     * @return false if the pool was out of room (nothing happened)
     */
    boolean mintsOrRunsOut(Minting call, int request, String what) {
        long before = pool.stateDigest();
        try {
            call.run();
            return true;
        } catch (LeaseIdsExhaustedException | LeaseCapacityException e) {
            exhaustions++;
            if (pool.stateDigest() != before) {
                throw sink.fail(Finding.Kind.ATOMICITY, request, what + " was refused (" + e.getMessage() + ") but changed the pool");
            }
            return false;
        }
    }

    /**
     * Presents a batch the model says the pool must refuse, through the rig (the engine adapter):
     * it must be refused with the exception the contract names, and change nothing.
     */
    void presentRefused(BatchCall call, int tenant, long holder, long[] batch, int request) {
        LeaseModel.Prediction p = model.predict(call, tenant, holder, batch, batch.length);
        if (!p.refused()) {
            throw new IllegalStateException("a hostile batch the model accepts: " + call + " " + java.util.Arrays.toString(batch));
        }
        String what = call + " of " + java.util.Arrays.toString(batch) + " as tenant " + tenant + " "
                + dev.kvshield.tenant.Owners.describe(holder);
        long before = pool.stateDigest();
        RuntimeException refused = null;
        try {
            rig.present(pool, call, tenant, holder, batch, batch.length, new long[batch.length], data.get());
        } catch (KvShieldException | IllegalArgumentException e) {
            refused = e;
        }
        if (refused == null) {
            throw sink.fail(Finding.Kind.REFUSAL, request, what + " was accepted; the contract refuses it (" + p.why() + ")");
        }
        if (pool.stateDigest() != before) {
            throw sink.fail(Finding.Kind.ATOMICITY, request, what + " was refused (" + refused.getMessage() + ") but changed the pool");
        }
        if (!p.allows(refused)) {
            throw sink.fail(Finding.Kind.REFUSAL, request, what + " was refused with " + refused + "; the contract names "
                    + p.refusals().stream().map(Class::getSimpleName).toList() + " (" + p.why() + ")");
        }
        refusals++;
    }

    // ---------------------------------------------------------------- holds

    /** Compares every page's holds and every live lease of the model with the pool. */
    void checkHolds() {
        int pages = pool.geometry().pageCount();
        for (int p = 0; p < pages; p++) {
            int content = pool.view().contentHolds(p);
            int claims = pool.view().claims(p);
            if (content != model.contentHolds(p) || claims != model.claims(p)) {
                throw sink.fail(Finding.Kind.HOLDS, -1, "page " + p + " has " + content + " content hold(s) and " + claims
                        + " claim(s); the model has " + model.contentHolds(p) + " and " + model.claims(p));
            }
        }
        for (LeaseModel.Hold h : model.liveHolds()) {
            if (!pool.view().isLive(h.id()) || pool.view().holderOf(h.id()) != h.holder() || pool.view().kindOf(h.id()) != h.kind()) {
                throw sink.fail(Finding.Kind.HOLDS, -1, "the model's " + h + " is " + (pool.view().isLive(h.id())
                        ? "held by " + pool.view().holderOf(h.id()) + " as " + pool.view().kindOf(h.id()) : "not live") + " in the pool");
            }
        }
    }

    // ---------------------------------------------------------------- failed protection

    /** A page event said this page's protection failed: its bytes are unknown from now on. */
    synchronized void protectionFailed(int page) {
        failedPages.add(page);
        everFailed.add(page);
    }

    /** A page handed out must not be one whose protection failed. */
    synchronized void checkNotFailed(int page, int request) {
        if (everFailed.contains(page)) {
            throw sink.fail(Finding.Kind.INVARIANT, request, "page " + page + ", whose protection failed, was handed out again");
        }
    }

    /**
     * After a step boundary: every page whose protection failed is still quarantined (its scrub
     * failed again) or retired, and a retired one holds only zeros.
     */
    synchronized void checkFailedPages() {
        for (int page : Set.copyOf(failedPages)) {
            PageState s = pool.view().stateOf(page);
            if (s != PageState.QUARANTINED && s != PageState.RETIRED) {
                throw sink.fail(Finding.Kind.INVARIANT, -1, "page " + page + ", whose protection failed, is " + s
                        + ": it must stay out of circulation until it is retired");
            }
            if (s == PageState.RETIRED) {
                if (!residue.checkHandOut(page, -1, false)) {
                    throw sink.fail(Finding.Kind.RESIDUE, -1, "page " + page + " was retired after its protection failed but still"
                            + " holds data: its scrub did not zero it");
                }
                failedPages.remove(page);
            }
        }
    }

    /** Pages whose protection failed and that are not yet retired and checked. */
    synchronized int pendingFailedPages() {
        return failedPages.size();
    }
}
