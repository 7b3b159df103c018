package dev.kvshield.perf.fuzz;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffOutcome;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.ForwardingPageMemory;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.stream.IntStream;

/** Planted bugs the fuzzer must find: each rig reproduces one class of engine or backend bug around a correct pool. */
final class PlantedRigs {
    private PlantedRigs() {}

    /** The backend's scrub returns without zeroing (a kernel launch that silently did nothing); start-up is still scrubbed. */
    static Rig skipScrub() {
        return new Rig() {
            @Override
            public PageMemory memory(PageMemory base) {
                return new AfterStartUp(base) {
                    @Override
                    void scrubAfterStartUp(int[] pages, int offset, int count) {}
                };
            }
        };
    }

    /**
     * The generation is not bumped (as seen by the prefix cache): its sealed references are
     * re-stamped with the page's current generation, so an old reference reclaims whatever the
     * page holds now.
     */
    static Rig skipGenerationBump() {
        return new Rig() {
            @Override
            public long reclaimReference(KvPagePool pool, long sealedReference) {
                int page = PageHandles.page(sealedReference);
                return PageHandles.encode(page, pool.view().generationOf(page));
            }
        };
    }

    /** A claim timeout frees: the expired transfer's claims are dropped and its pages released while it may still write. */
    static Rig freeOnClaimTimeout() {
        return new Rig() {
            @Override
            public void expire(KvPagePool pool, HandoffReceiver receiver, Reservation r) {
                receiver.acknowledge(r);
                receiver.abort(r);
            }
        };
    }

    /** The receiver commits on published coverage alone, without checking every reserved page was written. */
    static Rig acceptUnwrittenTransfer() {
        return new Rig() {
            @Override
            public CommitResult commit(KvPagePool pool, HandoffReceiver receiver, Reservation r, long coveredTokens) {
                if (coveredTokens < r.sequenceTokens()) {
                    return receiver.commit(r, coveredTokens);
                }
                return new CommitResult(HandoffOutcome.COMMITTED, r.sequenceTokens(), coveredTokens, -1, "committed");
            }

            @Override
            public void finish(KvPagePool pool, HandoffReceiver receiver, Reservation r) {
                long[] current = IntStream.range(0, r.pageCount()).mapToLong(r::lease).filter(pool.view()::isLive).toArray();
                pool.release(r.tenant(), Owners.request(r.request()), current, 0, current.length, ReleaseReason.FINISHED);
            }
        };
    }

    /**
     * An asynchronous backend that confirms protection when the work is queued, not when it is
     * done (a completion event recorded but never waited for); the protection worker zeroes the
     * oldest queued batch at each turn.
     */
    static Rig handOutBeforeProtectionCompleted() {
        return new Rig() {
            private final ArrayDeque<int[]> queued = new ArrayDeque<>();
            private PageMemory target;

            @Override
            public PageMemory memory(PageMemory base) {
                target = base;
                return new AfterStartUp(base) {
                    @Override
                    void scrubAfterStartUp(int[] pages, int offset, int count) {
                        synchronized (queued) {
                            queued.add(Arrays.copyOfRange(pages, offset, offset + count));
                        }
                    }
                };
            }

            @Override
            public void protectionStep() {
                int[] batch;
                synchronized (queued) {
                    batch = queued.poll();
                }
                if (batch != null) {
                    target.scrub(batch, 0, batch.length);
                }
            }
        };
    }

    /** A backend whose start-up scrub (the pool's first call) is real and whose later scrubs a planted bug replaces. */
    private abstract static class AfterStartUp extends ForwardingPageMemory {
        private boolean started;

        AfterStartUp(PageMemory delegate) {
            super(delegate);
        }

        abstract void scrubAfterStartUp(int[] pages, int offset, int count);

        @Override
        public void scrub(int[] pages, int offset, int count) {
            if (started) {
                scrubAfterStartUp(pages, offset, count);
            } else {
                started = true;
                super.scrub(pages, offset, count);
            }
        }
    }
}
