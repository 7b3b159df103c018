package dev.kvshield.pool;

import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.claims.ClaimRevokedException;
import dev.kvshield.claims.UnknownClaimException;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.DoubleFreeException;
import dev.kvshield.handle.InvalidHandleException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handle.StaleHandleException;
import dev.kvshield.internal.Bits;
import dev.kvshield.internal.ClaimTable;
import dev.kvshield.internal.Digests;
import dev.kvshield.internal.IntStack;
import dev.kvshield.internal.PageLru;
import dev.kvshield.internal.ProtectionQueue;
import dev.kvshield.internal.ReaderTable;
import dev.kvshield.lifecycle.PageLifecycle;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTransition;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.tenant.TenantRegistry;
import dev.kvshield.tenant.UnknownTenantException;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A KV-cache page pool that never hands a page to a new owner still holding old data, and never
 * lets a stale reference touch a page.
 *
 * <p>Contract, in the order an engine meets it:
 *
 * <ul>
 *   <li><b>Allocate</b> {@code count} pages for a tenant's request into a caller's {@code long[]}:
 *       all or nothing; "none" ({@code false}) when the pool or the tenant's quota cannot give them,
 *       with {@link #lastShortfall()} saying why. Page 0 is never handed out when reserved.
 *   <li><b>Use</b> pages through their handles: {@link #write}, {@link #read} (only slots written in
 *       the page's current generation), {@link #markWritten} for engines that write KV themselves.
 *   <li><b>Claims</b> fence pages that in-flight transfers still touch ({@link #claim},
 *       {@link #dropClaims}, {@link #fenceClaim}).
 *   <li><b>Release</b> bumps each page's generation before anything else, so every handle of the
 *       old owner is stale at once; the page is quarantined until its claims drain and its
 *       protection (none, zero, seal, zero and verify) is confirmed.
 *   <li><b>{@link #endStep()}</b>, once per scheduler step, is the only moment quarantined pages
 *       return to circulation (besides a drain when an allocation would otherwise fail), so every
 *       tensor-parallel rank fed the same calls makes the same decisions.
 * </ul>
 *
 * <p>Misuse (unknown tenant, malformed, stale or foreign handles, double free, reading unwritten
 * slots, revoked claims, bad sizes) throws a specific {@link dev.kvshield.KvShieldException} whose
 * message names the values, bumps a rejection counter, emits a rejection event and leaves the pool
 * exactly as it was: batch calls validate every element before changing anything. Guards are never
 * switchable; only what happens to bytes depends on the {@link ProtectionLevel}.
 *
 * <p>Thread-safe: every public method takes the pool lock. Hot paths ({@link #allocate},
 * {@link #release}, {@link #endStep}) do not allocate.
 *
 * <p>Implementation notes: page state lives in parallel primitive arrays indexed by page. The free
 * list is a stack whose top is the next page handed out, so a released batch is reused first and in
 * its own order (SGLang prepends freed pages the same way). Sealed pages sit in an LRU list and are
 * handed to others, zeroed, only after clean pages run out. Protection runs through a
 * {@link ProtectionQueue} either inline or on one worker thread; a step boundary collects batches
 * queued at least {@code releaseLagSteps} steps ago, waiting for any not finished yet, so
 * availability depends only on the call sequence, never on timing.
 */
public final class KvPagePool implements AutoCloseable {
    static final String NO_SEALER_MESSAGE = "protection level ENCRYPT needs a key source: configure a PageSealer"
            + " (tenant-keys provides one) with PoolConfig.Builder.sealer(...)";

    private static final System.Logger LOG = System.getLogger(KvPagePool.class.getName());
    private static final byte PHASE_NONE = 0;
    private static final byte PHASE_AWAITING_CLAIMS = 1;
    private static final byte PHASE_QUEUED = 2;
    private static final byte PHASE_RETRYING = 3;
    private static final int SHORTFALL_NONE = 0;
    private static final int SHORTFALL_POOL = 1;
    private static final int SHORTFALL_QUOTA = 2;
    private static final PageState[] STATES = PageState.values();
    // values() clones its array on every call: keep one copy so hot paths do not allocate.
    private static final ProtectionLevel[] LEVELS = ProtectionLevel.values();

    private final PoolConfig config;
    private final PoolGeometry geometry;
    private final PageMemory memory;
    private final TenantRegistry tenants;
    private final PageSealer sealer;
    private final PoolMetrics metrics;
    private final AdmissionLimits admission;
    private final ReentrantLock lock = new ReentrantLock();
    private volatile PageEventListener[] listeners;

    // Page table, guarded by lock.
    private final byte[] state;
    private final int[] generation;
    private final int[] ownerTenant;
    private final long[] owner;
    private final int[] claimCount;
    private final byte[] phase;
    private final byte[] pendingLevel;
    private final boolean[] retireAfterProtect;
    private final int[] sealTenant;
    private final int[] sealEpoch;
    private final long[] written;
    private final int wordsPerPage;
    private final int[] stateCounts = new int[STATES.length];
    private int claimedPages;
    private int queuedReusable;
    private int awaitingClaims;
    private int failedPages;
    private int[] ownedByTenant = new int[0];
    private boolean[] sharedNamespace = new boolean[0];

    private final IntStack free;
    private final PageLru sealed;
    private final ReaderTable readers;
    private final ClaimTable claims;
    private final ProtectionQueue queue;

    // Scratch, guarded by lock: validation marks and batch building, so hot paths do not allocate.
    private final int[] mark;
    private int markStamp;
    private final int[] scratchPages;
    private final int[] scratchGenerations;
    private final int[] scratchOther;
    private final int[] dirtyScratch;
    private long step;
    private volatile String haltReason;

    // Last "none" answer, guarded by lock.
    private int shortfallKind = SHORTFALL_NONE;
    private int shortfallTenant;
    private int shortfallRequested;
    private int shortfallQuota;
    private PoolSnapshot shortfallSnapshot;

    private KvPagePool(PoolConfig config, PageMemory memory) {
        this.config = config;
        this.geometry = config.geometry();
        if (!geometry.equals(memory.geometry())) {
            throw new InvalidGeometryException("memory geometry " + memory.geometry() + " differs from pool geometry " + geometry);
        }
        this.memory = memory;
        this.tenants = new TenantRegistry(this::validateTenant);
        this.listeners = config.listeners().toArray(new PageEventListener[0]);
        int pages = geometry.pageCount();
        state = new byte[pages];
        generation = new int[pages];
        Arrays.fill(generation, config.initialGeneration());
        ownerTenant = new int[pages];
        Arrays.fill(ownerTenant, -1);
        owner = new long[pages];
        Arrays.fill(owner, Owners.NOBODY);
        claimCount = new int[pages];
        phase = new byte[pages];
        pendingLevel = new byte[pages];
        retireAfterProtect = new boolean[pages];
        sealTenant = new int[pages];
        Arrays.fill(sealTenant, -1);
        sealEpoch = new int[pages];
        wordsPerPage = Bits.words(geometry.pageSizeTokens());
        written = new long[pages * wordsPerPage];
        free = new IntStack(pages);
        sealed = new PageLru(pages);
        readers = new ReaderTable(pages, config.maxReaders());
        claims = new ClaimTable(config.maxClaims(), wordsPerPage);
        mark = new int[pages];
        scratchPages = new int[pages];
        scratchGenerations = new int[pages];
        scratchOther = new int[pages];
        dirtyScratch = new int[pages];
        this.admission = AdmissionLimits.compute(geometry, config.admission());
        if (admission.isLowered()) {
            LOG.log(System.Logger.Level.WARNING, "pool " + config.poolId() + ": the pool cannot hold one max-length request:"
                    + " advertised " + admission.advertisedTokens() + " tokens, pool holds " + admission.poolHoldsTokens()
                    + " tokens; admitting only requests up to " + admission.effectiveTokens() + " tokens");
        }
        PageSealerFactory factory = config.sealer();
        this.sealer = factory == null ? null
                : factory.create(new PageSealerFactory.Context(config.poolId(), config.rank(), geometry, memory, tenants));
        this.metrics = new PoolMetrics(config.meterRegistry(), config.poolId(), config.rank(), new Gauges());
        scrubWholePool();
        int first = geometry.firstUsablePage();
        for (int p = pages - 1; p >= first; p--) {
            free.push(p);
        }
        if (geometry.pageZeroReserved()) {
            state[0] = (byte) PageState.RETIRED.ordinal();
            stateCounts[PageState.RETIRED.ordinal()] = 1;
        }
        stateCounts[PageState.FREE.ordinal()] = free.size();
        this.queue = new ProtectionQueue(pages, config.quarantineMode() == QuarantineMode.ASYNCHRONOUS, this::executeProtection,
                "kvshield-protect-" + config.poolId() + "-rank" + config.rank());
    }

    /**
     * Builds a pool over {@code memory}, scrubbing every page before the first allocation (and
     * verifying under {@code COMPLIANCE}). The pool does not close the memory.
     */
    public static KvPagePool create(PoolConfig config, PageMemory memory) {
        return new KvPagePool(config, memory);
    }

    private void scrubWholePool() {
        int pages = geometry.pageCount();
        int[] all = new int[pages];
        for (int p = 0; p < pages; p++) {
            all[p] = p;
        }
        memory.scrub(all, 0, pages);
        if (config.level() == ProtectionLevel.COMPLIANCE) {
            int dirty = memory.verifyZero(all, 0, pages, new int[pages]);
            if (dirty != 0) {
                throw new ProtectionException("start-up scrub left " + dirty + " of " + pages + " pages non-zero; refusing to start");
            }
        }
    }

    private void validateTenant(String name, TenantPolicy policy) {
        if (policy.effectiveLevel(config.level()) == ProtectionLevel.ENCRYPT && config.sealer() == null) {
            throw new IllegalArgumentException("tenant '" + name + "': " + NO_SEALER_MESSAGE);
        }
    }

    // ---------------------------------------------------------------- accessors

    public TenantRegistry tenants() {
        return tenants;
    }

    public PoolGeometry geometry() {
        return geometry;
    }

    public PageMemory memory() {
        return memory;
    }

    public PoolMetrics metrics() {
        return metrics;
    }

    public PoolConfig config() {
        return config;
    }

    public AdmissionLimits admission() {
        return admission;
    }

    /** The level a tenant's released pages get. */
    public ProtectionLevel levelOf(int tenant) {
        return tenants.policy(tenant).effectiveLevel(config.level());
    }

    /** Adds a page-event listener (for example the audit trail). */
    public void addListener(PageEventListener listener) {
        lock.lock();
        try {
            PageEventListener[] l = Arrays.copyOf(listeners, listeners.length + 1);
            l[l.length - 1] = listener;
            listeners = l;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Rejects a request longer than the effective limit before anything is reserved for it.
     *
     * @throws dev.kvshield.admission.RequestTooLongException naming both lengths
     */
    public void admit(long requestTokens) {
        admission.admit(requestTokens);
    }

    // ---------------------------------------------------------------- allocate

    /**
     * Hands {@code count} pages to {@code (tenant, owner)}, writing their handles into
     * {@code out[outOffset .. outOffset+count)}: all or nothing.
     *
     * @return {@code true} if the pages were handed out; {@code false} ("none") if the pool or the
     *     tenant's quota cannot give them now, the pool unchanged ({@link #lastShortfall()} says why)
     */
    public boolean allocate(int tenant, long owner, int count, long[] out, int outOffset) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkOwner(owner);
            checkRange("out", out.length, outOffset, count);
            checkHandOuts();
            if (count == 0) {
                return true;
            }
            int quota = tenants.policy(tenant).quotaPages();
            if (quota != TenantPolicy.UNLIMITED && (long) ownedByTenant[tenant] + count > quota) {
                return none(SHORTFALL_QUOTA, tenant, count, quota);
            }
            if (free.size() + sealed.size() < count && queuedReusable > 0) {
                collect(Long.MAX_VALUE, true);
            }
            if (free.size() + sealed.size() < count) {
                return none(SHORTFALL_POOL, tenant, count, quota);
            }
            int fromFree = Math.min(count, free.size());
            int fromSealed = count - fromFree;
            if (fromSealed > 0) {
                zeroSealedForHandOut(fromSealed);
            }
            for (int i = 0; i < count; i++) {
                int page;
                if (i < fromFree) {
                    page = free.pop();
                } else {
                    page = sealed.first();
                    sealed.remove(page);
                    sealTenant[page] = -1;
                }
                setState(page, PageLifecycle.next(stateOf0(page), PageTransition.ALLOCATE, page));
                ownerTenant[page] = tenant;
                this.owner[page] = owner;
                Bits.clear(written, page * wordsPerPage, wordsPerPage);
                out[outOffset + i] = PageHandles.encode(page, generation[page]);
                emit(PageEventType.ALLOCATE, page, generation[page], tenant, owner, 0);
            }
            ownedByTenant[tenant] += count;
            metrics.allocated(count);
            shortfallKind = SHORTFALL_NONE;
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** Zeroes the {@code n} oldest sealed pages before they go to a new owner; they stay SEALED if it fails. */
    private void zeroSealedForHandOut(int n) {
        int page = sealed.first();
        for (int i = 0; i < n; i++) {
            scratchOther[i] = page;
            page = sealed.after(page);
        }
        try {
            memory.scrub(scratchOther, 0, n);
        } catch (RuntimeException e) {
            // The ciphertext may be half-zeroed: never let its owner reclaim it.
            for (int i = 0; i < n; i++) {
                sealTenant[scratchOther[i]] = -1;
            }
            metrics.protectionFailed(n);
            throw new ProtectionException("zeroing " + n + " sealed pages at hand-out failed; nothing was handed out", e);
        }
    }

    private boolean none(int kind, int tenant, int requested, int quota) {
        shortfallKind = kind;
        shortfallTenant = tenant;
        shortfallRequested = requested;
        shortfallQuota = quota;
        shortfallSnapshot = snapshot0();
        metrics.allocationNone();
        return false;
    }

    /** Why the last allocation answered "none", with the page counts at that moment; empty if it did not. */
    public String lastShortfall() {
        lock.lock();
        try {
            return switch (shortfallKind) {
                case SHORTFALL_POOL -> "pool exhausted: tenant " + shortfallTenant + " asked for " + shortfallRequested + " pages; "
                        + shortfallSnapshot;
                case SHORTFALL_QUOTA -> "quota exhausted: tenant " + shortfallTenant + " asked for " + shortfallRequested
                        + " pages, owns " + ownedByTenant[shortfallTenant] + " of a quota of " + shortfallQuota + "; "
                        + shortfallSnapshot;
                default -> "";
            };
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- release

    /**
     * Releases pages owned by {@code (tenant, owner)}: validates every handle first, then bumps each
     * page's generation, quarantines it and queues its protection (or leaves it waiting for its
     * claims). Readers' access ends with the generation.
     *
     * @throws StaleHandleException, DoubleFreeException, ForeignAccessException,
     *     InvalidHandleException, UnknownTenantException — the pool unchanged
     */
    public void release(int tenant, long owner, long[] handles, int offset, int count, ReleaseReason reason) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkOwner(owner);
            checkRange("handles", handles.length, offset, count);
            if (reason == null) {
                throw new IllegalArgumentException("release reason must not be null");
            }
            int stamp = nextStamp();
            for (int i = offset; i < offset + count; i++) {
                int page = checkOwnedHandle(handles[i], tenant, owner, true);
                if (mark[page] == stamp) {
                    reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, tenant, owner, handles[i],
                            new DoubleFreeException(page, PageHandles.generation(handles[i]), generation[page],
                                    "listed twice in one release"));
                }
                mark[page] = stamp;
            }
            ProtectionLevel level = levelOf(tenant);
            if (level == ProtectionLevel.ENCRYPT && sealer != null && !sealer.canSeal(tenant)) {
                // A tenant without a usable key (e.g. shredded) never leaves plaintext behind: zero instead.
                level = ProtectionLevel.ZERO;
            }
            int protectable = 0;
            for (int i = offset; i < offset + count; i++) {
                int page = PageHandles.page(handles[i]);
                int next = generation[page] + 1;
                generation[page] = next;
                retireAfterProtect[page] = next == PageHandles.MAX_GENERATION;
                setState(page, PageLifecycle.next(PageState.OWNED, PageTransition.RELEASE, page));
                readers.clear(page);
                pendingLevel[page] = (byte) level.ordinal();
                emit(PageEventType.RELEASE, page, next, tenant, owner, reason.ordinal());
                if (claimCount[page] > 0) {
                    phase[page] = PHASE_AWAITING_CLAIMS;
                    awaitingClaims++;
                } else {
                    scratchPages[protectable] = page;
                    scratchGenerations[protectable] = next;
                    protectable++;
                }
            }
            ownedByTenant[tenant] -= count;
            metrics.released(count);
            if (protectable > 0) {
                submit(scratchPages, scratchGenerations, 0, protectable, level, tenant);
            }
        } finally {
            lock.unlock();
        }
    }

    private void submit(int[] pages, int[] gens, int offset, int count, ProtectionLevel level, int tenant) {
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            if (phase[page] != PHASE_RETRYING) {
                phase[page] = PHASE_QUEUED;
                if (!retireAfterProtect[page]) {
                    queuedReusable++;
                }
            }
            emit(PageEventType.PROTECT_ISSUED, page, gens[i], tenant, Owners.NOBODY, level.ordinal());
        }
        queue.submit(pages, gens, offset, count, (byte) level.ordinal(), tenant, step);
    }

    /** Runs one batch's protection; called inline (synchronous mode) or on the worker thread. */
    private int executeProtection(byte levelOrdinal, int tenant, int[] pages, int[] gens, int count, byte[] dirtyByPage) {
        ProtectionLevel level = LEVELS[levelOrdinal];
        long start = System.nanoTime();
        int epoch = 0;
        switch (level) {
            case NONE -> { }
            case ZERO -> memory.scrub(pages, 0, count);
            case COMPLIANCE -> {
                memory.scrub(pages, 0, count);
                // dirtyScratch is only used here, and protection runs on one thread at a time.
                int n = memory.verifyZero(pages, 0, count, dirtyScratch);
                for (int i = 0; i < n; i++) {
                    dirtyByPage[dirtyScratch[i]] = 1;
                }
            }
            case ENCRYPT -> epoch = sealer.seal(tenant, pages, gens, 0, count);
        }
        long bytes = level == ProtectionLevel.NONE ? 0 : count * geometry.pageBytesAllBuffers();
        metrics.protectedPages(level, count, bytes, System.nanoTime() - start);
        return epoch;
    }

    // ---------------------------------------------------------------- step boundary

    /**
     * The step boundary: collects every protection batch queued at least {@code releaseLagSteps}
     * steps ago (waiting for any still running), returns its pages to FREE or SEALED, retires pages
     * that failed verification or exhausted their generation, and re-queues failed batches.
     *
     * @return pages that became available at this boundary
     * @throws ProtectionException if a batch was not confirmed within the protection timeout; its
     *     pages stay quarantined and the next boundary tries again
     */
    public int endStep() {
        lock.lock();
        try {
            int made = collect(step - config.releaseLagSteps(), false);
            step++;
            for (PageEventListener l : listeners) {
                try {
                    l.onStepBoundary(step);
                } catch (RuntimeException e) {
                    metrics.listenerFailed();
                }
            }
            return made;
        } finally {
            lock.unlock();
        }
    }

    private int collect(long maxStep, boolean drainAll) {
        int made = 0;
        int retry = 0;
        long end = queue.tail();
        for (long b = queue.head(); b < end; b++) {
            if (!drainAll && queue.step(b) > maxStep) {
                break;
            }
            if (!queue.await(b, config.protectionTimeoutNanos())) {
                throw new ProtectionException("protection batch " + b + " (" + queue.count(b) + " pages) was not confirmed within "
                        + config.protectionTimeoutNanos() / 1_000_000 + " ms; its pages stay quarantined");
            }
            ProtectionLevel level = LEVELS[queue.level(b)];
            int tenant = queue.tenant(b);
            int n = queue.count(b);
            if (queue.status(b) == ProtectionQueue.FAILED) {
                String error = queue.error(b);
                LOG.log(System.Logger.Level.ERROR, "pool " + config.poolId() + ": " + level + " protection of " + n
                        + " pages failed; they stay quarantined and are retried at the next step boundary: " + error);
                metrics.protectionFailed(n);
                for (int i = 0; i < n; i++) {
                    int page = queue.page(b, i);
                    if (phase[page] == PHASE_QUEUED) {
                        if (!retireAfterProtect[page]) {
                            queuedReusable--;
                        }
                        failedPages++;
                        phase[page] = PHASE_RETRYING;
                    }
                    if (level == ProtectionLevel.ENCRYPT) {
                        // A failed seal may have consumed its one keystream use, or the key may be gone:
                        // the retry zeroes instead. The page comes back clean, just not reclaimable.
                        pendingLevel[page] = (byte) ProtectionLevel.ZERO.ordinal();
                    }
                    scratchPages[retry] = page;
                    scratchGenerations[retry] = queue.generation(b, i);
                    scratchOther[retry] = tenant;
                    retry++;
                    emit(PageEventType.PROTECT_FAILED, page, generation[page], tenant, Owners.NOBODY, level.ordinal());
                }
                queue.popHead();
                continue;
            }
            int epoch = queue.epoch(b);
            for (int i = 0; i < n; i++) {
                int page = queue.page(b, i);
                finishProtection(page, level, tenant, epoch, queue.dirty(page));
            }
            // Push in reverse so the batch is handed out again in its own order (LIFO, like SGLang's prepend).
            for (int i = n - 1; i >= 0; i--) {
                int page = queue.page(b, i);
                if (state[page] == PageState.FREE.ordinal()) {
                    free.push(page);
                    made++;
                } else if (state[page] == PageState.SEALED.ordinal()) {
                    made++;
                }
            }
            queue.popHead();
        }
        submitGrouped(retry);
        return made;
    }

    private void finishProtection(int page, ProtectionLevel level, int tenant, int epoch, boolean dirty) {
        int g = generation[page];
        if (phase[page] == PHASE_RETRYING) {
            failedPages--;
        } else if (!retireAfterProtect[page]) {
            queuedReusable--;
        }
        phase[page] = PHASE_NONE;
        emit(PageEventType.PROTECT_DONE, page, g, tenant, Owners.NOBODY, level.ordinal());
        if (dirty) {
            metrics.verifyFailed(1);
            emit(PageEventType.VERIFY_FAILED, page, g, tenant, Owners.NOBODY, level.ordinal());
            retire(page, RetireReason.VERIFY_FAILED);
        } else if (retireAfterProtect[page]) {
            retire(page, RetireReason.GENERATION_EXHAUSTED);
        } else if (level == ProtectionLevel.ENCRYPT) {
            setState(page, PageLifecycle.next(PageState.QUARANTINED, PageTransition.PROTECTED_SEALED, page));
            sealTenant[page] = tenant;
            sealEpoch[page] = epoch;
            sealed.addLast(page);
            emit(PageEventType.SEAL, page, g, tenant, Owners.NOBODY, epoch);
        } else {
            setState(page, PageLifecycle.next(PageState.QUARANTINED, PageTransition.PROTECTED_FREE, page));
            emit(PageEventType.FREE, page, g, -1, Owners.NOBODY, 0);
        }
        ownerTenant[page] = -1;
        owner[page] = Owners.NOBODY;
    }

    private void retire(int page, RetireReason reason) {
        setState(page, PageLifecycle.next(stateOf0(page), PageTransition.RETIRE, page));
        emit(PageEventType.RETIRE, page, generation[page], ownerTenant[page], Owners.NOBODY, reason.ordinal());
    }

    private void swap(int i, int j) {
        int p = scratchPages[i];
        int g = scratchGenerations[i];
        int t = scratchOther[i];
        scratchPages[i] = scratchPages[j];
        scratchGenerations[i] = scratchGenerations[j];
        scratchOther[i] = scratchOther[j];
        scratchPages[j] = p;
        scratchGenerations[j] = g;
        scratchOther[j] = t;
    }

    // ---------------------------------------------------------------- reclaim (ENCRYPT)

    /**
     * Reclaims sealed pages for a prefix hit: for each sealed reference
     * ({@link PageHandles#sealedReference}) still sealed under {@code tenant}, decrypts the page in
     * place and hands it to {@code owner}; otherwise answers {@link PageHandles#NONE} ("gone": the
     * engine recomputes). A reference to a page sealed by another tenant, or an older generation of
     * one sealed by this tenant, is counted as a rejection and answers "gone" too.
     *
     * @return how many pages were reclaimed; {@code out[outOffset + i]} is the new handle or NONE
     */
    public int reclaim(int tenant, long owner, long[] sealedRefs, int offset, int count, long[] out, int outOffset) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkOwner(owner);
            checkRange("sealedRefs", sealedRefs.length, offset, count);
            checkRange("out", out.length, outOffset, count);
            checkHandOuts();
            int stamp = nextStamp();
            int hits = 0;
            for (int i = 0; i < count; i++) {
                long ref = sealedRefs[offset + i];
                out[outOffset + i] = PageHandles.NONE;
                if (!PageHandles.isWellFormed(ref) || PageHandles.page(ref) >= geometry.pageCount()) {
                    reject(Rejection.INVALID, PageEventType.REJECT_STALE, -1, tenant, owner, ref, null);
                    metrics.reclaimed(false);
                    continue;
                }
                int page = PageHandles.page(ref);
                int g = PageHandles.generation(ref);
                boolean sealedHere = state[page] == PageState.SEALED.ordinal() && sealTenant[page] >= 0;
                if (sealedHere && sealTenant[page] != tenant) {
                    reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, tenant, owner, ref, null);
                    metrics.reclaimed(false);
                } else if (sealedHere && generation[page] != g) {
                    reject(Rejection.STALE, PageEventType.REJECT_STALE, page, tenant, owner, ref, null);
                    metrics.reclaimed(false);
                } else if (!sealedHere || mark[page] == stamp || !sealer.isEpochAvailable(tenant, sealEpoch[page])) {
                    metrics.reclaimed(false);
                } else {
                    mark[page] = stamp;
                    scratchPages[hits] = page;
                    scratchGenerations[hits] = g;
                    scratchOther[hits] = i;
                    hits++;
                }
            }
            int quota = tenants.policy(tenant).quotaPages();
            if (quota != TenantPolicy.UNLIMITED && (long) ownedByTenant[tenant] + hits > quota) {
                hits = Math.max(0, quota - ownedByTenant[tenant]);
            }
            unsealByEpoch(tenant, hits);
            for (int h = 0; h < hits; h++) {
                int page = scratchPages[h];
                sealed.remove(page);
                int epoch = sealEpoch[page];
                sealTenant[page] = -1;
                setState(page, PageLifecycle.next(PageState.SEALED, PageTransition.RECLAIM, page));
                ownerTenant[page] = tenant;
                this.owner[page] = owner;
                out[outOffset + scratchOther[h]] = PageHandles.encode(page, generation[page]);
                emit(PageEventType.RECLAIM, page, generation[page], tenant, owner, epoch);
                metrics.reclaimed(true);
            }
            ownedByTenant[tenant] += hits;
            metrics.allocated(hits);
            return hits;
        } finally {
            lock.unlock();
        }
    }

    /** Unseals the first {@code hits} scratch pages, one sealer call per distinct epoch. */
    private void unsealByEpoch(int tenant, int hits) {
        int done = 0;
        while (done < hits) {
            int epoch = sealEpoch[scratchPages[done]];
            int k = done;
            for (int i = done; i < hits; i++) {
                if (sealEpoch[scratchPages[i]] == epoch) {
                    swap(i, k);
                    k++;
                }
            }
            try {
                sealer.unseal(tenant, epoch, scratchPages, scratchGenerations, done, k - done);
            } catch (RuntimeException e) {
                for (int i = done; i < hits; i++) {
                    sealTenant[scratchPages[i]] = -1;
                }
                metrics.protectionFailed(hits - done);
                throw new ProtectionException("unsealing " + (k - done) + " pages of tenant " + tenant + " (epoch " + epoch
                        + ") failed; they can no longer be reclaimed", e);
            }
            done = k;
        }
    }

    /**
     * Crypto-shreds a tenant: destroys its keys through the sealer and makes every page it sealed
     * unreclaimable (each reported as a {@code SHRED} event with its epoch).
     *
     * @return the number of sealed pages that became unrecoverable
     */
    public int shredTenant(int tenant) {
        lock.lock();
        try {
            checkTenant(tenant);
            if (sealer == null) {
                throw new IllegalStateException("pool " + config.poolId() + " has no key source; nothing to shred");
            }
            sealer.shred(tenant);
            int n = 0;
            for (int p = sealed.first(); p != -1; p = sealed.after(p)) {
                if (sealTenant[p] == tenant) {
                    sealTenant[p] = -1;
                    emit(PageEventType.SHRED, p, generation[p], tenant, Owners.NOBODY, sealEpoch[p]);
                    n++;
                }
            }
            return n;
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- write / read / extent

    /** Writes whole token slots of one buffer of an owned page and records them as written. */
    public void write(int tenant, long owner, long handle, int buffer, int slot, MemorySegment src) {
        lock.lock();
        try {
            checkTenant(tenant);
            int page = checkOwnedHandle(handle, tenant, owner, false);
            int tokens = tokensOf(buffer, src.byteSize());
            memory.write(page, buffer, slot, src);
            markWritten0(page, slot, slot + tokens, tenant, owner);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Records slots {@code [fromSlot, toSlot)} of an owned page as written in its current
     * generation, for engines that write KV memory themselves (the bridge passes each step's plan).
     */
    public void markWritten(int tenant, long owner, long handle, int fromSlot, int toSlot) {
        lock.lock();
        try {
            checkTenant(tenant);
            int page = checkOwnedHandle(handle, tenant, owner, false);
            geometry.checkSlots(fromSlot, toSlot - fromSlot);
            markWritten0(page, fromSlot, toSlot, tenant, owner);
        } finally {
            lock.unlock();
        }
    }

    private void markWritten0(int page, int from, int to, int tenant, long owner) {
        if (to > from) {
            Bits.set(written, page * wordsPerPage, from, to);
            emit(PageEventType.WRITE, page, generation[page], tenant, owner, ((long) from << 32) | to);
        }
    }

    /**
     * Reads token slots of one buffer of a page. The reader is the owner, or a reader the owner
     * added, of the owner's tenant; every slot read must have been written in the page's current
     * generation.
     *
     * @throws ReadBeforeWriteException naming the first unwritten slot
     */
    public void read(int tenant, long reader, long handle, int buffer, int slot, MemorySegment dst) {
        lock.lock();
        try {
            checkTenant(tenant);
            int page = checkReadableHandle(handle, tenant, reader);
            int tokens = tokensOf(buffer, dst.byteSize());
            geometry.checkSlots(slot, tokens);
            checkWritten(page, slot, slot + tokens, tenant, reader, handle);
            memory.read(page, buffer, slot, dst);
            emit(PageEventType.READ, page, generation[page], tenant, reader, ((long) slot << 32) | (slot + tokens));
        } finally {
            lock.unlock();
        }
    }

    /** True if the handle names an OWNED page at its current generation (never throws). */
    public boolean isCurrent(long handle) {
        lock.lock();
        try {
            if (!PageHandles.isWellFormed(handle) || PageHandles.page(handle) >= geometry.pageCount()) {
                return false;
            }
            int page = PageHandles.page(handle);
            return state[page] == PageState.OWNED.ordinal() && generation[page] == PageHandles.generation(handle);
        } finally {
            lock.unlock();
        }
    }

    /** True if slots {@code [fromSlot, toSlot)} of the handle's page were written in its generation. */
    public boolean isWritten(long handle, int fromSlot, int toSlot) {
        lock.lock();
        try {
            int page = checkLiveHandle(handle, -1, Owners.NOBODY);
            geometry.checkSlots(fromSlot, toSlot - fromSlot);
            return Bits.allSet(written, page * wordsPerPage, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    private void checkWritten(int page, int from, int to, int tenant, long reader, long handle) {
        int unwritten = Bits.firstUnset(written, page * wordsPerPage, from, to);
        if (unwritten >= 0) {
            metrics.readBeforeWrite();
            emit(PageEventType.REJECT_READ_BEFORE_WRITE, page, generation[page], tenant, reader, handle);
            throw new ReadBeforeWriteException("read before write: page=" + page + " generation=" + generation[page] + " slot="
                    + unwritten + " was not written in this generation (read of slots [" + from + ", " + to + "))");
        }
    }

    private int tokensOf(int buffer, long byteSize) {
        geometry.checkBuffer(buffer);
        int bpt = geometry.bytesPerToken(buffer);
        if (byteSize <= 0 || byteSize % bpt != 0 || byteSize / bpt > geometry.pageSizeTokens()) {
            throw new InvalidGeometryException(byteSize + " bytes is not a whole number of " + bpt + "-byte tokens of buffer " + buffer
                    + " within one page of " + geometry.pageSizeTokens() + " slots");
        }
        return (int) (byteSize / bpt);
    }

    // ---------------------------------------------------------------- readers and ownership

    /** Lets request {@code readerRequest} of the owner's tenant read a page (a shared prefix). */
    public void addReader(int tenant, long owner, long handle, long readerRequest) {
        addReader(tenant, owner, handle, tenant, readerRequest);
    }

    /**
     * Lets request {@code readerRequest} of {@code readerTenant} read a page. Readers are of the
     * owner's tenant, except for pages of a {@linkplain #declareSharedNamespace shared namespace},
     * which any tenant that is not regulated may read.
     *
     * @throws ForeignAccessException for a reader of another tenant on a page that is not shared, or
     *     a regulated reader on a shared page
     */
    public void addReader(int tenant, long owner, long handle, int readerTenant, long readerRequest) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkTenant(readerTenant);
            checkOwner(readerRequest);
            int page = checkOwnedHandle(handle, tenant, owner, false);
            if (readerTenant != tenant && !(sharedNamespace[tenant] && !tenants.policy(readerTenant).regulated())) {
                throw reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, readerTenant, readerRequest, handle,
                        new ForeignAccessException("tenant " + readerTenant + " may not read page " + page + " of tenant " + tenant
                                + (sharedNamespace[tenant] ? ": regulated tenants never share pages" : ": not a shared namespace")));
            }
            readers.add(page, readerTenant, readerRequest);
            emit(PageEventType.READER_ADDED, page, generation[page], readerTenant, owner, readerRequest);
        } finally {
            lock.unlock();
        }
    }

    public void removeReader(int tenant, long owner, long handle, long readerRequest) {
        removeReader(tenant, owner, handle, tenant, readerRequest);
    }

    public void removeReader(int tenant, long owner, long handle, int readerTenant, long readerRequest) {
        lock.lock();
        try {
            checkTenant(tenant);
            int page = checkOwnedHandle(handle, tenant, owner, false);
            if (readers.remove(page, readerTenant, readerRequest)) {
                emit(PageEventType.READER_REMOVED, page, generation[page], readerTenant, owner, readerRequest);
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Declares a tenant a shared namespace (an operator's public system prompt, say): requests of any
     * tenant that is not regulated may be added as readers of its pages. Its pages are still
     * protected at release under its own level and key.
     */
    public void declareSharedNamespace(int tenant) {
        lock.lock();
        try {
            checkTenant(tenant);
            if (tenants.policy(tenant).regulated()) {
                throw new IllegalArgumentException("regulated tenant " + tenant + " cannot be a shared namespace");
            }
            sharedNamespace[tenant] = true;
        } finally {
            lock.unlock();
        }
    }

    /** Whether {@code tenant} was {@linkplain #declareSharedNamespace declared} a shared namespace. */
    public boolean isSharedNamespace(int tenant) {
        lock.lock();
        try {
            checkTenant(tenant);
            return sharedNamespace[tenant];
        } finally {
            lock.unlock();
        }
    }

    /**
     * Moves pages from one owner to another of the same tenant (a finished request's pages into its
     * tenant's prefix-cache namespace). Generations and readers are kept.
     */
    public void transferOwnership(int tenant, long fromOwner, long toOwner, long[] handles, int offset, int count) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkOwner(toOwner);
            checkRange("handles", handles.length, offset, count);
            for (int i = offset; i < offset + count; i++) {
                checkOwnedHandle(handles[i], tenant, fromOwner, false);
            }
            for (int i = offset; i < offset + count; i++) {
                int page = PageHandles.page(handles[i]);
                owner[page] = toOwner;
                emit(PageEventType.OWNERSHIP_TRANSFER, page, generation[page], tenant, toOwner, fromOwner);
            }
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- claims

    /**
     * Takes a claim on an owned page for an in-flight transfer; the claim keeps the page
     * quarantined after release until it is dropped.
     *
     * @param peer who holds the claim (a transfer or peer id), for audit
     * @return the claim id
     */
    public long claim(int tenant, long owner, long handle, ClaimKind kind, long peer) {
        lock.lock();
        try {
            checkTenant(tenant);
            if (kind == null) {
                throw new IllegalArgumentException("claim kind must not be null");
            }
            int page = checkOwnedHandle(handle, tenant, owner, false);
            long id = claims.take(page, generation[page], kind, tenant, owner, peer);
            if (claimCount[page]++ == 0) {
                claimedPages++;
            }
            emitClaim(PageEventType.CLAIM_TAKEN, page, tenant, owner, id, kind, peer);
            return id;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Claims every page of a batch (all or nothing) into {@code claimIdsOut}.
     */
    public void claimAll(int tenant, long owner, long[] handles, int offset, int count, ClaimKind kind, long peer,
            long[] claimIdsOut, int outOffset) {
        lock.lock();
        try {
            checkTenant(tenant);
            checkRange("handles", handles.length, offset, count);
            checkRange("claimIdsOut", claimIdsOut.length, outOffset, count);
            if (kind == null) {
                throw new IllegalArgumentException("claim kind must not be null");
            }
            for (int i = offset; i < offset + count; i++) {
                checkOwnedHandle(handles[i], tenant, owner, false);
            }
            if (claims.freeCapacity() < count) {
                throw new dev.kvshield.claims.ClaimCapacityException(count + " claims asked for, " + claims.freeCapacity()
                        + " claim slots free; raise maxClaims");
            }
            for (int i = 0; i < count; i++) {
                claimIdsOut[outOffset + i] = claim(tenant, owner, handles[offset + i], kind, peer);
            }
        } finally {
            lock.unlock();
        }
    }

    /** Writes through a live claim (a transfer landing). Writes in the page's claimed generation count as written. */
    public void writeClaimed(long claimId, int buffer, int slot, MemorySegment src) {
        lock.lock();
        try {
            int c = checkLiveClaim(claimId);
            int page = claims.page(c);
            int tokens = tokensOf(buffer, src.byteSize());
            memory.write(page, buffer, slot, src);
            claims.markWritten(c, slot, slot + tokens);
            if (state[page] == PageState.OWNED.ordinal() && generation[page] == claims.pageGeneration(c)) {
                markWritten0(page, slot, slot + tokens, claims.tenant(c), claims.owner(c));
            }
        } finally {
            lock.unlock();
        }
    }

    /** Reads through a live claim (a transfer sending); slots must be written in the page's generation. */
    public void readClaimed(long claimId, int buffer, int slot, MemorySegment dst) {
        lock.lock();
        try {
            int c = checkLiveClaim(claimId);
            int page = claims.page(c);
            int tokens = tokensOf(buffer, dst.byteSize());
            geometry.checkSlots(slot, tokens);
            if (generation[page] != claims.pageGeneration(c) || state[page] != PageState.OWNED.ordinal()) {
                // The page was released while the transfer read it: its content is no longer the owner's.
                throw reject(Rejection.STALE, PageEventType.REJECT_STALE, page, claims.tenant(c), claims.owner(c), claimId,
                        new StaleHandleException(page, claims.pageGeneration(c), generation[page], stateOf0(page).name()));
            }
            checkWritten(page, slot, slot + tokens, claims.tenant(c), claims.owner(c), claimId);
            memory.read(page, buffer, slot, dst);
            emit(PageEventType.READ, page, generation[page], claims.tenant(c), claims.owner(c), ((long) slot << 32) | (slot + tokens));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Records slots {@code [fromSlot, toSlot)} as written through a live claim, for transports that
     * write page memory themselves (RDMA, a copy engine) and report what landed.
     */
    public void markClaimWritten(long claimId, int fromSlot, int toSlot) {
        lock.lock();
        try {
            int c = checkLiveClaim(claimId);
            geometry.checkSlots(fromSlot, toSlot - fromSlot);
            if (toSlot > fromSlot) {
                int page = claims.page(c);
                claims.markWritten(c, fromSlot, toSlot);
                if (state[page] == PageState.OWNED.ordinal() && generation[page] == claims.pageGeneration(c)) {
                    markWritten0(page, fromSlot, toSlot, claims.tenant(c), claims.owner(c));
                }
            }
        } finally {
            lock.unlock();
        }
    }

    /** True if a live or revoked claim wrote every slot of {@code [fromSlot, toSlot)} through itself. */
    public boolean claimWrote(long claimId, int fromSlot, int toSlot) {
        lock.lock();
        try {
            int c = claimSlot(claimId);
            geometry.checkSlots(fromSlot, toSlot - fromSlot);
            return claims.wrote(c, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    /** The page generation a live or revoked claim was taken at. */
    public int claimGeneration(long claimId) {
        lock.lock();
        try {
            return claims.pageGeneration(claimSlot(claimId));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Fences a claim (it expired): any later use fails with {@link ClaimRevokedException}, but the
     * page stays claimed, and so quarantined, until the claim is dropped on evidence that the
     * transfer drained. A timeout is never a free.
     */
    public void fenceClaim(long claimId) {
        lock.lock();
        try {
            int c = claimSlot(claimId);
            if (claims.state(c) == ClaimTable.LIVE) {
                claims.revoke(c);
                int page = claims.page(c);
                emitClaim(PageEventType.CLAIM_FENCED, page, claims.tenant(c), claims.owner(c), claimId, claims.kind(c), claims.peer(c));
            }
        } finally {
            lock.unlock();
        }
    }

    /** Drops one claim on evidence the transfer is done (acknowledged or known drained). */
    public void dropClaim(long claimId) {
        lock.lock();
        try {
            claimSlot(claimId);
            submitGrouped(dropValidated(claimId, 0));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Drops a batch of claims (all validated first); released pages whose last claim this drops
     * have their protection queued, grouped by tenant and level.
     */
    public void dropClaims(long[] claimIds, int offset, int count) {
        lock.lock();
        try {
            checkRange("claimIds", claimIds.length, offset, count);
            for (int i = offset; i < offset + count; i++) {
                claimSlot(claimIds[i]);
                for (int j = offset; j < i; j++) {
                    if (claimIds[j] == claimIds[i]) {
                        throw new UnknownClaimException("claim " + Long.toHexString(claimIds[i]) + " listed twice in one drop");
                    }
                }
            }
            int protectable = 0;
            for (int i = offset; i < offset + count; i++) {
                protectable = dropValidated(claimIds[i], protectable);
            }
            submitGrouped(protectable);
        } finally {
            lock.unlock();
        }
    }

    private int dropValidated(long claimId, int protectable) {
        int c = claims.slotOf(claimId);
        int page = claims.page(c);
        emitClaim(PageEventType.CLAIM_DROPPED, page, claims.tenant(c), claims.owner(c), claimId, claims.kind(c), claims.peer(c));
        claims.drop(c);
        if (--claimCount[page] == 0) {
            claimedPages--;
            if (state[page] == PageState.QUARANTINED.ordinal() && phase[page] == PHASE_AWAITING_CLAIMS) {
                awaitingClaims--;
                phase[page] = PHASE_NONE;
                scratchPages[protectable] = page;
                scratchGenerations[protectable] = generation[page];
                scratchOther[protectable] = ownerTenant[page];
                protectable++;
            }
        }
        return protectable;
    }

    /** Queues scratch pages (tenant in scratchOther), one batch per (tenant, level) so each batch has one key. */
    private void submitGrouped(int n) {
        int start = 0;
        while (start < n) {
            int tenant = scratchOther[start];
            byte level = pendingLevel[scratchPages[start]];
            int k = start;
            for (int i = start; i < n; i++) {
                if (scratchOther[i] == tenant && pendingLevel[scratchPages[i]] == level) {
                    swap(i, k);
                    k++;
                }
            }
            submit(scratchPages, scratchGenerations, start, k - start, LEVELS[level], tenant);
            start = k;
        }
    }

    private int claimSlot(long claimId) {
        int c = claims.slotOf(claimId);
        if (c < 0) {
            throw reject(Rejection.INVALID, PageEventType.REJECT_STALE, -1, -1, Owners.NOBODY, claimId,
                    new UnknownClaimException("unknown claim 0x" + Long.toHexString(claimId)
                            + ": malformed, already dropped, or of another pool"));
        }
        return c;
    }

    private int checkLiveClaim(long claimId) {
        int c = claimSlot(claimId);
        if (claims.state(c) != ClaimTable.LIVE) {
            int page = claims.page(c);
            throw reject(Rejection.REVOKED_CLAIM, PageEventType.REJECT_REVOKED_CLAIM, page, claims.tenant(c), claims.owner(c),
                    claimId, new ClaimRevokedException("claim 0x" + Long.toHexString(claimId) + " on page " + page
                            + " was fenced (expired); its transfer must not touch the page"));
        }
        return c;
    }

    // ---------------------------------------------------------------- halting

    /**
     * Stops every hand-out (allocate, reclaim) until {@link #resumeHandOuts()}: used when the pool
     * cannot run safely, e.g. {@code COMPLIANCE} with an audit sink that cannot write.
     */
    public void haltHandOuts(String reason) {
        haltReason = reason == null ? "halted" : reason;
        LOG.log(System.Logger.Level.ERROR, "pool " + config.poolId() + " stopped handing out pages: " + haltReason);
    }

    public void resumeHandOuts() {
        haltReason = null;
    }

    private void checkHandOuts() {
        String reason = haltReason;
        if (reason != null) {
            throw new HandOutsHaltedException("pool " + config.poolId() + " hands out no pages: " + reason);
        }
    }

    // ---------------------------------------------------------------- state queries

    /** Pages {@code allocate} can hand out now: free, sealed, and queued for protection. */
    public int available() {
        lock.lock();
        try {
            return available0();
        } finally {
            lock.unlock();
        }
    }

    private int available0() {
        return free.size() + sealed.size() + queuedReusable;
    }

    /** {@link #available()} in token slots, as SGLang's {@code available_size()} counts. */
    public long availableTokens() {
        return (long) available() * geometry.pageSizeTokens();
    }

    public PoolSnapshot snapshot() {
        lock.lock();
        try {
            return snapshot0();
        } finally {
            lock.unlock();
        }
    }

    private PoolSnapshot snapshot0() {
        int quarantined = stateCounts[PageState.QUARANTINED.ordinal()];
        int retired = stateCounts[PageState.RETIRED.ordinal()] - (geometry.pageZeroReserved() ? 1 : 0);
        return new PoolSnapshot(stateCounts[PageState.FREE.ordinal()], stateCounts[PageState.SEALED.ordinal()],
                stateCounts[PageState.OWNED.ordinal()], quarantined, retired, awaitingClaims,
                quarantined - awaitingClaims - failedPages, failedPages, claimedPages, claims.live(), claims.revoked(),
                available0(), step);
    }

    public PageState stateOf(int page) {
        geometry.checkPage(page);
        lock.lock();
        try {
            return stateOf0(page);
        } finally {
            lock.unlock();
        }
    }

    /** The page's current generation (diagnostics and tests). */
    public int generationOf(int page) {
        geometry.checkPage(page);
        lock.lock();
        try {
            return generation[page];
        } finally {
            lock.unlock();
        }
    }

    /**
     * The tenant owning a page while it is {@code OWNED}, else -1: lets an engine bridge mirror
     * ownership that a handoff or the prefix cache changed.
     */
    public int ownerTenantOf(int page) {
        geometry.checkPage(page);
        lock.lock();
        try {
            return state[page] == PageState.OWNED.ordinal() ? ownerTenant[page] : -1;
        } finally {
            lock.unlock();
        }
    }

    /** The owner (request or namespace) of a page while it is {@code OWNED}, else {@link Owners#NOBODY}. */
    public long ownerOf(int page) {
        geometry.checkPage(page);
        lock.lock();
        try {
            return state[page] == PageState.OWNED.ordinal() ? owner[page] : Owners.NOBODY;
        } finally {
            lock.unlock();
        }
    }

    /** The tenant a page is sealed for (reclaimable by), or -1. */
    public int sealedFor(int page) {
        geometry.checkPage(page);
        lock.lock();
        try {
            return state[page] == PageState.SEALED.ordinal() ? sealTenant[page] : -1;
        } finally {
            lock.unlock();
        }
    }

    /** Pages owned by a tenant (quota accounting). */
    public int ownedBy(int tenant) {
        lock.lock();
        try {
            checkTenant(tenant);
            return ownedByTenant[tenant];
        } finally {
            lock.unlock();
        }
    }

    public long step() {
        lock.lock();
        try {
            return step;
        } finally {
            lock.unlock();
        }
    }

    /**
     * A digest of every page's state, generation, owner, claims, extent, readers, the free-list
     * order, the sealed order and the protection queue: equal digests before and after a rejected
     * call prove it changed nothing.
     */
    public long stateDigest() {
        lock.lock();
        try {
            long h = 17;
            for (int p = 0; p < state.length; p++) {
                h = Digests.mix(h, state[p]);
                h = Digests.mix(h, generation[p]);
                h = Digests.mix(h, ownerTenant[p]);
                h = Digests.mix(h, owner[p]);
                h = Digests.mix(h, claimCount[p]);
                h = Digests.mix(h, phase[p]);
                h = Digests.mix(h, sealTenant[p]);
                for (int w = 0; w < wordsPerPage; w++) {
                    h = Digests.mix(h, written[p * wordsPerPage + w]);
                }
                h = readers.digest(h, p);
            }
            h = free.digest(h);
            h = sealed.digest(h);
            h = claims.digest(h);
            h = queue.digest(h);
            for (int t = 0; t < tenants.size(); t++) {
                h = Digests.mix(h, t < ownedByTenant.length ? ownedByTenant[t] : 0);
            }
            return Digests.mix(h, step);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- validation

    private PageState stateOf0(int page) {
        return STATES[state[page]];
    }

    private void setState(int page, PageState next) {
        stateCounts[state[page]]--;
        state[page] = (byte) next.ordinal();
        stateCounts[next.ordinal()]++;
    }

    private void checkTenant(int tenant) {
        if (!tenants.isRegistered(tenant)) {
            metrics.rejected(Rejection.UNKNOWN_TENANT);
            throw new UnknownTenantException("unknown tenant id " + tenant + " (" + tenants.size() + " registered)");
        }
        if (tenant >= ownedByTenant.length) {
            ownedByTenant = Arrays.copyOf(ownedByTenant, Math.max(tenant + 1, ownedByTenant.length * 2));
            sharedNamespace = Arrays.copyOf(sharedNamespace, ownedByTenant.length);
        }
    }

    private static void checkOwner(long owner) {
        if (!Owners.isValid(owner)) {
            throw new IllegalArgumentException("invalid owner reference " + owner + " (use Owners.request or Owners.namespace)");
        }
    }

    private static void checkRange(String what, int length, int offset, int count) {
        if (count < 0 || offset < 0 || offset > length - count) {
            throw new IllegalArgumentException(what + ": range [" + offset + ", " + ((long) offset + count)
                    + ") is outside an array of " + length + " (count must be >= 0)");
        }
    }

    private int nextStamp() {
        if (++markStamp == Integer.MAX_VALUE) {
            Arrays.fill(mark, 0);
            markStamp = 1;
        }
        return markStamp;
    }

    /** Checks a handle names a live, owned page of this generation; returns the page. */
    private int checkLiveHandle(long handle, int tenant, long owner) {
        if (!PageHandles.isWellFormed(handle) || PageHandles.page(handle) >= geometry.pageCount()) {
            throw reject(Rejection.INVALID, PageEventType.REJECT_STALE, -1, tenant, owner, handle,
                    new InvalidHandleException("not a handle of this pool: " + PageHandles.describe(handle) + " (pool has "
                            + geometry.pageCount() + " pages)"));
        }
        int page = PageHandles.page(handle);
        int g = PageHandles.generation(handle);
        if (g > generation[page]) {
            throw reject(Rejection.INVALID, PageEventType.REJECT_STALE, page, tenant, owner, handle,
                    new InvalidHandleException("foreign handle: page=" + page + " generation=" + g
                            + " is ahead of the page's current generation " + generation[page]));
        }
        if (g != generation[page] || state[page] != PageState.OWNED.ordinal()) {
            throw reject(Rejection.STALE, PageEventType.REJECT_STALE, page, tenant, owner, handle,
                    new StaleHandleException(page, g, generation[page], stateOf0(page).name()));
        }
        return page;
    }

    /** Checks a handle names a page owned by exactly {@code (tenant, owner)}; release mode names double frees. */
    private int checkOwnedHandle(long handle, int tenant, long owner, boolean releasing) {
        if (releasing && PageHandles.isWellFormed(handle) && PageHandles.page(handle) < geometry.pageCount()) {
            int page = PageHandles.page(handle);
            int g = PageHandles.generation(handle);
            if (g + 1 == generation[page] && state[page] != PageState.OWNED.ordinal() && ownerOrLast(page, tenant)) {
                throw reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, tenant, owner, handle,
                        new DoubleFreeException(page, g, generation[page], "already released; page is " + stateOf0(page)));
            }
        }
        int page = checkLiveHandle(handle, tenant, owner);
        if (ownerTenant[page] != tenant || this.owner[page] != owner) {
            throw reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, tenant, owner, handle,
                    new ForeignAccessException("page " + page + " generation " + generation[page] + " is owned by tenant "
                            + ownerTenant[page] + " " + Owners.describe(this.owner[page]) + ", not by tenant " + tenant + " "
                            + Owners.describe(owner)));
        }
        return page;
    }

    /** True while a quarantined page still remembers this tenant as its last owner, or the page moved on (free, sealed, retired). */
    private boolean ownerOrLast(int page, int tenant) {
        return state[page] != PageState.QUARANTINED.ordinal() || ownerTenant[page] == tenant;
    }

    private int checkReadableHandle(long handle, int tenant, long reader) {
        int page = checkLiveHandle(handle, tenant, reader);
        boolean isOwner = ownerTenant[page] == tenant && owner[page] == reader;
        boolean isReader = readers.contains(page, tenant, reader);
        if (!isOwner && !isReader) {
            throw reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, tenant, reader, handle,
                    new ForeignAccessException("page " + page + " generation " + generation[page] + " is owned by tenant "
                            + ownerTenant[page] + " " + Owners.describe(owner[page]) + "; tenant " + tenant + " "
                            + Owners.describe(reader) + " is neither its owner nor a reader"));
        }
        return page;
    }

    /** Counts and reports a rejection; returns the exception for the caller to throw (null: no exception). */
    private <E extends RuntimeException> E reject(Rejection kind, PageEventType event, int page, int tenant, long owner, long detail,
            E exception) {
        metrics.rejected(kind);
        emit(event, page, page >= 0 ? generation[page] : 0, tenant, owner, detail);
        if (exception != null) {
            throw exception;
        }
        return null;
    }

    private void emitClaim(PageEventType type, int page, int tenant, long owner, long claimId, ClaimKind kind, long peer) {
        for (PageEventListener l : listeners) {
            try {
                l.onClaimEvent(type, page, generation[page], tenant, owner, claimId, kind, peer);
            } catch (RuntimeException e) {
                metrics.listenerFailed();
            }
        }
    }

    private void emit(PageEventType type, int page, int gen, int tenant, long owner, long detail) {
        for (PageEventListener l : listeners) {
            try {
                l.onPageEvent(type, page, gen, tenant, owner, detail);
            } catch (RuntimeException e) {
                metrics.listenerFailed();
            }
        }
    }

    /** Stops the protection worker (after finishing its current batch). Does not close the memory. */
    @Override
    public void close() {
        queue.close();
        if (sealer != null) {
            sealer.close();
        }
    }

    private final class Gauges implements PoolMetrics.GaugeSource {
        @Override
        public long pagesIn(PageState s) {
            int n = stateCounts[s.ordinal()];
            return s == PageState.RETIRED && geometry.pageZeroReserved() ? n - 1 : n;
        }

        @Override
        public long claimedPages() {
            return claimedPages;
        }

        @Override
        public long effectiveLimitTokens() {
            return admission.effectiveTokens();
        }

        @Override
        public long advertisedLimitTokens() {
            return admission.advertisedTokens();
        }
    }
}
