package dev.kvshield.quarantine;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.internal.Digests;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.lifecycle.PageTransition;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.protection.Protection;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.seal.SealedPages;
import dev.kvshield.tenant.Owners;

/**
 * Where released pages wait: for their claims to drain, for their protection to be confirmed, and
 * for a step boundary. Pages leave it only at {@link #collect} (a step boundary, or a drain when an
 * allocation would otherwise fail), so availability depends only on the call sequence.
 *
 * <p>A page is in one phase: awaiting claims, queued (protection submitted, not yet collected),
 * failed (its protection, or other work that touched it, failed), or none. A failed page is never
 * returned to FREE: it is kept here, in pool state, scrubbed at the next boundary and then retired;
 * a scrub that fails again keeps it here for the boundary after.
 *
 * <p>Not thread-safe: guarded by the pool lock, except the protection worker of
 * {@link QuarantineMode#ASYNCHRONOUS}, which touches only the {@link ProtectionQueue}. Used only by
 * the pool (ModuleBoundariesTest keeps it inside allocator-api). Does not allocate after
 * construction.
 */
public final class Quarantine implements AutoCloseable {
    private static final byte NONE = 0;
    private static final byte AWAITING_CLAIMS = 1;
    private static final byte QUEUED = 2;
    private static final byte FAILED = 3;
    /** A failed page still not zero after its scrub at the boundary: retired as a verify failure. */
    private static final byte FAILED_DIRTY = 4;

    private final PageTable table;
    private final SealedPages sealed;
    private final PageEvents events;
    private final PoolMetrics metrics;
    private final PageMemory memory;
    private final Protection[] byLevel;
    private final ProtectionQueue queue;
    private final long timeoutNanos;
    private final System.Logger log;
    private final String poolId;
    /** Whether a batch's outcome is known when it is submitted (no worker): {@link #queuedReusable} follows it then. */
    private final boolean settledAtSubmit;

    private final byte[] phase;
    private final byte[] level;
    private final boolean[] retireAfter;
    private int awaitingClaims;
    private int queuedReusable;

    private final int[] failed;
    private int failedCount;

    private final int[] pendingPages;
    private final int[] pendingGenerations;
    private int pendingCount;
    /** Whether the pending pages are of more than one (tenant, strategy): only then does submitPending group them. */
    private boolean pendingMixed;
    /** The first pending page's tenant and level, which every later one is compared with. */
    private int pendingTenant;
    private byte pendingLevel;
    private final int[] dirtyScratch;
    /** A collected batch's pages, and those of them that became FREE, in batch order. */
    private final int[] batchScratch;
    private final int[] freedScratch;

    /**
     * @param byLevel the pool's strategy for each {@code ProtectionLevel} ordinal
     * @param timeoutNanos how long a boundary waits for a queued batch before failing loudly
     */
    public Quarantine(PageTable table, SealedPages sealed, PageEvents events, PoolMetrics metrics, PageMemory memory,
            Protection[] byLevel, QuarantineMode mode, long timeoutNanos, String poolId, System.Logger log) {
        this.table = table;
        this.sealed = sealed;
        this.events = events;
        this.metrics = metrics;
        this.memory = memory;
        this.byLevel = byLevel.clone();
        this.timeoutNanos = timeoutNanos;
        this.poolId = poolId;
        this.log = log;
        int pages = table.pageCount();
        phase = new byte[pages];
        level = new byte[pages];
        retireAfter = new boolean[pages];
        failed = new int[pages];
        pendingPages = new int[pages];
        pendingGenerations = new int[pages];
        dirtyScratch = new int[pages];
        batchScratch = new int[pages];
        freedScratch = new int[pages];
        settledAtSubmit = mode != QuarantineMode.ASYNCHRONOUS;
        queue = new ProtectionQueue(pages, !settledAtSubmit, this::protect, "kvshield-protect-" + poolId);
    }

    private int protect(byte levelOrdinal, int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage) {
        Protection p = byLevel[levelOrdinal];
        long start = System.nanoTime();
        int epoch = p.protect(tenant, pages, generations, count, dirtyByPage);
        metrics.protectedPages(p.level(), count, p.bytesTouched(count), System.nanoTime() - start);
        return epoch;
    }

    /**
     * A page just left OWNED (its generation already moved to {@code generation}): its protection
     * waits for its claims, or joins the batch {@link #submitPending} queues.
     *
     * @param retire the page's generation is exhausted: retire it once protected
     */
    public void released(int page, int generation, Protection protection, boolean claimed, boolean retire) {
        byte lvl = (byte) protection.level().ordinal();
        level[page] = lvl;
        retireAfter[page] = retire;
        if (claimed) {
            phase[page] = AWAITING_CLAIMS;
            awaitingClaims++;
        } else {
            pend(page, generation, lvl, retire);
        }
    }

    /**
     * Releases each page of {@code pages[offset, offset + count)}, in order, as the page table's {@link
     * PageTable#bumpGeneration} and {@link PageTable#move} (RELEASE) then {@link #released} would: pages of {@code tenant}
     * whose last hold just ended (unclaimed), protected under {@code protection}; a page whose new generation is {@code
     * retireGeneration} (its last) is retired once protected. Each page's new generation goes to {@code generationsOut[i]}.
     *
     * <p>Implementation notes: one loop over the pages for the page table and the quarantine; whether the run joins the
     * pending pages as one (tenant, strategy) is decided once, and the counters are stored once, so a page's work does not
     * wait on the previous page's.
     */
    public void releaseUnclaimed(int[] pages, int offset, int count, int tenant, Protection protection, int retireGeneration,
            int[] generationsOut) {
        if (count == 0) {
            return;
        }
        byte lvl = (byte) protection.level().ordinal();
        joinPending(tenant, lvl);
        int reusable = 0;
        for (int i = 0; i < count; i++) {
            int page = pages[offset + i];
            int generation = table.bumpGeneration(page);
            table.move(page, PageTransition.RELEASE);
            generationsOut[i] = generation;
            boolean retire = generation == retireGeneration;
            level[page] = lvl;
            retireAfter[page] = retire;
            phase[page] = QUEUED;
            reusable += retire ? 0 : 1;
        }
        System.arraycopy(pages, offset, pendingPages, pendingCount, count);
        System.arraycopy(generationsOut, 0, pendingGenerations, pendingCount, count);
        queuedReusable += reusable;
        pendingCount += count;
    }

    /** Pages of {@code tenant} under strategy level {@code lvl} join the pending ones: notes whether the batch stays one kind. */
    private void joinPending(int tenant, byte lvl) {
        if (pendingCount == 0) {
            pendingTenant = tenant;
            pendingLevel = lvl;
        } else if (tenant != pendingTenant || lvl != pendingLevel) {
            pendingMixed = true;
        }
    }

    /** The last claim on a page was dropped: a released page waiting for it joins the pending batch. */
    public void claimsDrained(int page) {
        if (phase[page] == AWAITING_CLAIMS) {
            awaitingClaims--;
            pend(page, table.generation(page), level[page], retireAfter[page]);
        }
    }

    /**
     * Implementation notes: compares with the first page's tenant and level kept in fields, and writes
     * {@code pendingMixed} only when it turns true: a release pends every page, so a read-modify-write of
     * shared state per page would chain each page's work to the previous one's.
     */
    private void pend(int page, int generation, byte lvl, boolean retire) {
        phase[page] = QUEUED;
        if (!retire) {
            queuedReusable++;
        }
        joinPending(table.tenant(page), lvl);
        pendingPages[pendingCount] = page;
        pendingGenerations[pendingCount] = generation;
        pendingCount++;
    }

    /** Queues the pending pages' protection, one batch per (tenant, strategy) so each batch has one key. */
    public void submitPending(long step) {
        int start = 0;
        while (start < pendingCount) {
            int tenant = table.tenant(pendingPages[start]);
            byte lvl = level[pendingPages[start]];
            int k = start;
            if (!pendingMixed) {
                k = pendingCount; // NOTE: one (tenant, strategy): the whole batch, in release order
            } else {
                for (int i = start; i < pendingCount; i++) {
                    if (table.tenant(pendingPages[i]) == tenant && level[pendingPages[i]] == lvl) {
                        swapPending(i, k++);
                    }
                }
            }
            if (events.hasListeners()) {
                for (int i = start; i < k; i++) {
                    events.emit(PageEventType.PROTECT_ISSUED, pendingPages[i], pendingGenerations[i], tenant, Owners.NOBODY, lvl);
                }
            }
            long b = queue.submit(pendingPages, pendingGenerations, start, k - start, lvl, tenant, step);
            if (settledAtSubmit) {
                queuedReusable -= lostToProtection(b);
            }
            start = k;
        }
        pendingCount = 0;
        pendingMixed = false;
    }

    private void swapPending(int i, int j) {
        int p = pendingPages[i];
        int g = pendingGenerations[i];
        pendingPages[i] = pendingPages[j];
        pendingGenerations[i] = pendingGenerations[j];
        pendingPages[j] = p;
        pendingGenerations[j] = g;
    }

    /**
     * Pages that work outside protection touched and failed on (clearing sealed pages for hand-out,
     * unsealing a reclaim): their bytes are unknown, so they leave circulation for scrub and
     * retirement. They must be SEALED and already out of the sealed set.
     */
    public void failTouched(int[] pages, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            table.move(page, PageTransition.PROTECTION_FAILED);
            events.emit(PageEventType.PROTECT_FAILED, page, table.generation(page), table.tenant(page), Owners.NOBODY, 0);
            fail(page);
        }
        metrics.protectionFailed(count);
    }

    private void fail(int page) {
        phase[page] = FAILED;
        failed[failedCount++] = page;
    }

    /**
     * Collects every batch queued up to step {@code maxStep} (every batch when {@code drainAll}),
     * waiting for any still running: confirmed pages become FREE or SEALED (or RETIRED: verification
     * failed, generation exhausted), failed batches' pages join the failed set. Then scrubs the
     * failed set and retires it.
     *
     * @return pages that became available
     * @throws ProtectionException if a batch was not confirmed in time; it stays queued (pool state)
     *     and the next boundary waits for it again
     */
    public int collect(long maxStep, boolean drainAll) {
        int made = 0;
        long end = queue.tail();
        for (long b = queue.head(); b < end; b++) {
            if (!drainAll && queue.step(b) > maxStep) {
                break;
            }
            if (!queue.await(b, timeoutNanos)) {
                throw notConfirmed(b);
            }
            made += queue.status(b) == ProtectionQueue.FAILED ? failBatch(b) : finishBatch(b);
            queue.popHead();
        }
        scrubAndRetireFailed();
        return made;
    }

    private ProtectionException notConfirmed(long b) {
        return new ProtectionException("pool " + poolId + ": protection batch " + b + " (" + queue.count(b)
                + " pages) was not confirmed within " + timeoutNanos / 1_000_000 + " ms; its pages stay quarantined");
    }

    /**
     * Of settled batch {@code b}'s pages that would be reusable, how many its protection made unusable: all of a failed
     * batch, else those found dirty.
     */
    private int lostToProtection(long b) {
        boolean failedBatch = queue.status(b) == ProtectionQueue.FAILED;
        if (!failedBatch && !byLevel[queue.level(b)].verifies()) {
            return 0; // NOTE: no page to look at: every release's batch passes here, and only a verifying level marks dirty
        }
        int lost = 0;
        for (int i = 0, n = queue.count(b); i < n; i++) {
            int page = queue.page(b, i);
            lost += !retireAfter[page] && (failedBatch || queue.dirty(page)) ? 1 : 0;
        }
        return lost;
    }

    /**
     * Pages finishing every queued batch would make reusable ({@link #collect} with {@code drainAll}): {@link
     * #queuedReusable} less what protection lost in batches not settled at submit, each awaited as collect would.
     *
     * @throws ProtectionException if a batch was not confirmed in time, as collect would; nothing changed
     */
    public int drainYield() {
        if (settledAtSubmit) {
            return queuedReusable;
        }
        int yield = queuedReusable;
        for (long b = queue.head(), end = queue.tail(); b < end; b++) {
            if (!queue.await(b, timeoutNanos)) {
                throw notConfirmed(b);
            }
            yield -= lostToProtection(b);
        }
        return yield;
    }

    private int failBatch(long b) {
        int n = queue.count(b);
        Protection p = byLevel[queue.level(b)];
        log.log(System.Logger.Level.ERROR, "pool " + poolId + ": " + p.level() + " protection of " + n + " pages failed ("
                + queue.error(b) + "); they are scrubbed and retired, never reused");
        metrics.protectionFailed(n);
        for (int i = 0; i < n; i++) {
            int page = queue.page(b, i);
            if (!retireAfter[page] && !settledAtSubmit) {
                queuedReusable--;
            }
            events.emit(PageEventType.PROTECT_FAILED, page, table.generation(page), queue.tenant(b), Owners.NOBODY,
                    p.level().ordinal());
            fail(page);
        }
        return 0;
    }

    /**
     * Pages of {@code tenant} in submitted seal batches not yet collected (their ciphertext is under
     * the tenant's current keys, or will be): what a shred makes unrecoverable beside the sealed set.
     */
    public int sealsInFlight(int tenant) {
        int n = 0;
        for (long b = queue.head(), end = queue.tail(); b < end; b++) {
            if (queue.tenant(b) == tenant && byLevel[queue.level(b)].seals() && queue.status(b) != ProtectionQueue.FAILED) {
                for (int i = 0, count = queue.count(b); i < count; i++) {
                    n += retireAfter[queue.page(b, i)] ? 0 : 1;
                }
            }
        }
        return n;
    }

    /**
     * Implementation notes: the batch's strategy, level and whether anyone listens are read once (none can change under
     * the pool lock), the batch's pages are copied out of the ring at once, and the count of reusable pages is stored once:
     * the loop runs once per released page at every step boundary.
     */
    private int finishBatch(long b) {
        Protection p = byLevel[queue.level(b)];
        int lvl = p.level().ordinal();
        boolean seals = p.seals();
        boolean emitting = events.hasListeners();
        int tenant = queue.tenant(b);
        int epoch = queue.epoch(b);
        int n = queue.count(b);
        int sealedNow = 0;
        int freed = 0;
        int reusable = 0;
        queue.copyPages(b, batchScratch);
        for (int i = 0; i < n; i++) {
            int page = batchScratch[i];
            phase[page] = NONE;
            boolean dirty = queue.dirty(page);
            reusable += retireAfter[page] || (settledAtSubmit && dirty) ? 0 : 1;
            if (emitting) {
                events.emit(PageEventType.PROTECT_DONE, page, table.generation(page), tenant, Owners.NOBODY, lvl);
            }
            if (dirty) {
                metrics.verifyFailed(1);
                events.emit(PageEventType.VERIFY_FAILED, page, table.generation(page), tenant, Owners.NOBODY, lvl);
                retire(page, RetireReason.VERIFY_FAILED);
            } else if (retireAfter[page]) {
                retire(page, RetireReason.GENERATION_EXHAUSTED);
            } else if (seals) {
                table.move(page, PageTransition.PROTECTED_SEALED);
                sealed.add(page, tenant, epoch);
                sealedNow++;
            } else {
                table.move(page, PageTransition.PROTECTED_FREE);
                if (emitting) {
                    events.emit(PageEventType.FREE, page, table.generation(page), -1, Owners.NOBODY, 0);
                }
                freedScratch[freed++] = page;
            }
            table.setTenant(page, -1);
        }
        queuedReusable -= reusable;
        // The batch's free pages are handed out again in its own order (LIFO, like SGLang's prepend).
        table.pushFreeInOrder(freedScratch, freed);
        return sealedNow + freed;
    }

    private void scrubAndRetireFailed() {
        if (failedCount == 0) {
            return;
        }
        int dirty;
        try {
            dirty = memory.scrubAndVerify(failed, 0, failedCount, dirtyScratch);
        } catch (RuntimeException | Error e) { // whatever the backend throws, the pages stay out of reach
            log.log(System.Logger.Level.ERROR, "pool " + poolId + ": scrubbing " + failedCount + " failed pages failed again ("
                    + e + "); they stay quarantined and are scrubbed at the next step boundary");
            return;
        }
        for (int i = 0; i < dirty; i++) {
            phase[dirtyScratch[i]] = FAILED_DIRTY;
        }
        for (int i = 0; i < failedCount; i++) {
            int page = failed[i];
            boolean stillDirty = phase[page] == FAILED_DIRTY;
            phase[page] = NONE;
            if (stillDirty) {
                metrics.verifyFailed(1);
                events.emit(PageEventType.VERIFY_FAILED, page, table.generation(page), table.tenant(page), Owners.NOBODY, 0);
            }
            retire(page, stillDirty ? RetireReason.VERIFY_FAILED : RetireReason.PROTECTION_FAILED);
            table.setTenant(page, -1);
        }
        failedCount = 0;
    }

    private void retire(int page, RetireReason reason) {
        table.move(page, PageTransition.RETIRE);
        events.emit(PageEventType.RETIRE, page, table.generation(page), table.tenant(page), Owners.NOBODY, reason.ordinal());
    }

    /**
     * Released pages whose protection is queued and that will be reusable: part of what allocate can hand out. Exact
     * when batches settle at submit (synchronous); with a worker, pages of a batch whose protection fails count until
     * the boundary that collects it (its outcome arrives in the background, and this count must not change there).
     */
    public int queuedReusable() {
        return queuedReusable;
    }

    public int awaitingClaims() {
        return awaitingClaims;
    }

    public int failed() {
        return failedCount;
    }

    public long digest(long h) {
        for (int p = 0; p < phase.length; p++) {
            h = Digests.mix(h, phase[p] * 31L + level[p] + (retireAfter[p] ? 7 : 0));
        }
        for (int i = 0; i < failedCount; i++) {
            h = Digests.mix(h, failed[i]);
        }
        return queue.digest(Digests.mix(h, awaitingClaims * 31L + queuedReusable));
    }

    /** Stops the protection worker after its current batch. */
    @Override
    public void close() {
        queue.close();
    }
}
