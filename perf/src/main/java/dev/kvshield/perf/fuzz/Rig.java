package dev.kvshield.perf.fuzz;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import java.lang.foreign.MemorySegment;

/**
 * The engine-side seams a trace runs through. {@link #CLEAN} is kvshield as shipped: the pool's
 * own memory and handoff calls. Planted-bug twins (test code) override one seam to reproduce a
 * class of engine or backend bug; a rig is used for one run and may keep state.
 */
public interface Rig {
    /** kvshield as shipped. */
    Rig CLEAN = new Rig() {};

    /** The backend the pool runs on, built over {@code base} (the truth the oracles read). */
    default PageMemory memory(PageMemory base) {
        return base;
    }

    /** The protection worker advances one unit of deferred work (backends that complete later). */
    default void protectionStep() {}

    default CommitResult commit(KvPagePool pool, HandoffReceiver receiver, Reservation r, long coveredTokens) {
        return receiver.commit(r, coveredTokens);
    }

    /** The transfer's claim timer fired. */
    default void expire(KvPagePool pool, HandoffReceiver receiver, Reservation r) {
        receiver.expire(r);
    }

    /** A committed handoff request finished decoding. */
    default void finish(KvPagePool pool, HandoffReceiver receiver, Reservation r) {
        receiver.finish(r);
    }

    /** The sealed reference the prefix cache passes to {@code reclaim}. */
    default long reclaimReference(KvPagePool pool, long sealedReference) {
        return sealedReference;
    }

    /**
     * The engine adapter frees holds of one kind by their pages, as SGLang frees slot indices
     * ({@link KvPagePool#releaseHeldPages}); {@code found} receives each page's lease.
     */
    default boolean releaseByPages(KvPagePool pool, int tenant, long holder, LeaseKind kind, int[] pages, ReleaseReason reason,
            long[] found) {
        return pool.releaseHeldPages(tenant, holder, kind, pages, 0, pages.length, reason, found, 0);
    }

    /**
     * The engine adapter presents a batch of leases to the pool as {@code (tenant, holder)}: the
     * trace's unmatches, claim churn and hostile batches go through here.
     */
    default void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
            MemorySegment data) {
        call.apply(pool, tenant, holder, batch, count, out, data);
    }
}
