package dev.kvshield.perf.fuzz;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffOutcome;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.LeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseIdsExhaustedException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import java.lang.foreign.MemorySegment;
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

    /** The adapter's free by pages leaves out the last page it was given (an off-by-one in its slot-to-page pass). */
    static Rig releaseOnePageShort() {
        return new Rig() {
            @Override
            public boolean releaseByPages(KvPagePool pool, int tenant, long holder, LeaseKind kind, int[] pages, ReleaseReason reason,
                    long[] found) {
                return pool.releaseHeldPages(tenant, holder, kind, pages, 0, Math.max(0, pages.length - 1), reason, found, 0);
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

    /**
     * An adapter that presents a batch one id at a time (a per-id loop over the pool): the good ids
     * before a bad one are applied before the bad one is refused.
     */
    static Rig splitBatches() {
        return new Rig() {
            @Override
            public void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
                    MemorySegment data) {
                long[] one = new long[1];
                for (int i = 0; i < count; i++) {
                    call.apply(pool, tenant, holder, new long[] {batch[i]}, 1, one, data);
                    if (out != null) {
                        out[i] = one[0];
                    }
                }
            }
        };
    }

    /** An adapter that drops ids listed twice before it calls the pool, so a duplicated batch is never refused. */
    static Rig dedupBatches() {
        return new Rig() {
            @Override
            public void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
                    MemorySegment data) {
                long[] distinct = Arrays.stream(batch, 0, count).distinct().toArray();
                call.apply(pool, tenant, holder, distinct, distinct.length, out, data);
            }
        };
    }

    /** A confused deputy: refused for presenting another's lease, the adapter presents it again as that lease's holder. */
    static Rig confusedDeputy() {
        return new Rig() {
            @Override
            public void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
                    MemorySegment data) {
                try {
                    call.apply(pool, tenant, holder, batch, count, out, data);
                } catch (ForeignLeaseException e) {
                    long theirs = e.lease();
                    call.apply(pool, pool.view().tenantOfLease(theirs), pool.view().holderOf(theirs), batch, count, out, data);
                }
            }
        };
    }

    /** An adapter that, when the pool runs out of lease ids, hands its caller the claims of its previous call again (a wrap). */
    static Rig recycleIdsWhenExhausted() {
        return new Rig() {
            private long[] last = new long[0];

            @Override
            public void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
                    MemorySegment data) {
                try {
                    call.apply(pool, tenant, holder, batch, count, out, data);
                    if (call == BatchCall.CLAIM) {
                        last = Arrays.copyOf(out, count);
                    }
                } catch (LeaseIdsExhaustedException e) {
                    if (call != BatchCall.CLAIM || last.length == 0) {
                        throw e;
                    }
                    for (int i = 0; i < count; i++) {
                        out[i] = last[i % last.length];
                    }
                }
            }
        };
    }

    /**
     * An adapter whose unmatch, refused for a reader lease the request does not hold, "cleans up"
     * by releasing the cache's own lease on that page.
     */
    static Rig unmatchReleasesTheCachesLease() {
        return new Rig() {
            @Override
            public void present(KvPagePool pool, BatchCall call, int tenant, long holder, long[] batch, int count, long[] out,
                    MemorySegment data) {
                try {
                    call.apply(pool, tenant, holder, batch, count, out, data);
                } catch (LeaseException e) {
                    int page = pool.view().pageOf(batch[0]);
                    long ns = Owners.namespace(tenant);
                    long cached = call == BatchCall.UNMATCH && page >= 0
                            ? pool.view().leaseOf(page, tenant, ns, LeaseKind.NAMESPACE) : LeaseIds.NONE;
                    if (cached != LeaseIds.NONE) {
                        pool.release(tenant, ns, new long[] {cached}, 0, 1, ReleaseReason.FINISHED);
                    }
                    throw e;
                }
            }
        };
    }

    /** A backend whose scrub of pages that failed protection (scrub and verify at the boundary) zeroes nothing and reports them clean. */
    static Rig lyingScrubOfFailedPages() {
        return new Rig() {
            @Override
            public PageMemory memory(PageMemory base) {
                return new ForwardingPageMemory(base) {
                    private boolean started;

                    @Override
                    public int scrubAndVerify(int[] pages, int offset, int count, int[] dirtyOut) {
                        if (!started) {
                            started = true;
                            return super.scrubAndVerify(pages, offset, count, dirtyOut);
                        }
                        return 0;
                    }
                };
            }
        };
    }

    /** A backend that faults part way through a scrub but reports it complete: the rest of the batch keeps its bytes. */
    static Rig faultReportedAsDone() {
        return new Rig() {
            @Override
            public PageMemory memory(PageMemory base) {
                return new ForwardingPageMemory(base) {
                    @Override
                    public void scrub(int[] pages, int offset, int count) {
                        try {
                            super.scrub(pages, offset, count);
                        } catch (Faults.InjectedFault e) {
                            // Planted bug: the fault is swallowed.
                        }
                    }
                };
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
