package dev.kvshield.pool;

import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.extent.WrittenExtent;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.internal.Digests;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lease.StaleLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.Protection;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.Quarantine;
import dev.kvshield.seal.SealedPages;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A KV-cache page pool that never hands a page to a new owner still holding old data, and never
 * lets a stale or foreign hold touch a page.
 *
 * <p>Every hold on a page is a lease the pool mints ({@link dev.kvshield.lease}): a 64-bit id never
 * reused, bound to page, generation, tenant, holder and {@link LeaseKind}. Contract, in the order an
 * engine meets it:
 *
 * <ul>
 *   <li><b>Hand out</b> pages ({@link #allocate}, {@link #reclaim}) into a caller's {@code long[]}
 *       of leases: all or nothing; "none" ({@code false}) when the pool or the tenant's quota cannot
 *       give them, with {@link #lastShortfall()} saying why. A reserved page 0 is never handed out.
 *   <li><b>Share</b> a held page with another holder ({@link #share}: a cache namespace, a prefix
 *       reader, a deferred free), hand a hold over ({@link #transfer}), or fence it for an in-flight
 *       transfer ({@link #claim}).
 *   <li><b>Use</b> pages through leases: {@link #write}, {@link #read} (only slots written in the
 *       page's current generation), {@link #markWritten} for engines that write KV themselves.
 *   <li><b>Release</b> holds ({@link #release}, {@link #dropClaims}). When a page's last content
 *       hold goes, its generation moves before anything else, so every lease of that generation is
 *       dead; the page is quarantined until its claims drain and its protection is confirmed.
 *   <li><b>{@link #endStep()}</b>, once per scheduler step, is the only moment quarantined pages
 *       return to circulation (besides a drain when an allocation would otherwise fail), so every
 *       tensor-parallel rank fed the same calls makes the same decisions.
 * </ul>
 *
 * <p>Every batch call validates its whole input (duplicates included), then applies with no step
 * that can fail; work that can fail (clearing sealed pages, unsealing) runs first, and its failure
 * sends every page it touched to scrub and retirement. Misuse throws a specific
 * {@link dev.kvshield.KvShieldException} naming the values, is counted and emitted, and leaves the
 * pool exactly as it was. Guards are never switchable; only what happens to bytes depends on each
 * tenant's {@link Protection}.
 *
 * <p>Thread-safe: every public method takes the pool lock. Hot paths ({@link #allocate},
 * {@link #release}, {@link #endStep}) do not allocate.
 *
 * <p>Implementation notes: this class locks and routes; the state lives in parts over one
 * {@link PageTable}: {@link LeaseTable} (holds and claims), {@link Quarantine} (protection queue,
 * failed pages, step boundaries), {@link SealedPages} (seal bookkeeping, reclaim, shred),
 * {@link WrittenExtent}; the operations over them in package-private {@code HandOuts},
 * {@code Holds}, {@code DataAccess} and {@code Guards} (argument checks). {@link #view()} answers
 * read-only queries over the same parts.
 */
public final class KvPagePool implements AutoCloseable {
    static final System.Logger LOG = System.getLogger(KvPagePool.class.getName());

    private final PoolConfig config;
    private final PoolGeometry geometry;
    private final PageMemory memory;
    private final TenantRegistry tenants;
    private final PageSealer sealer;
    private final PoolMetrics metrics;
    private final AdmissionLimits admission;
    private final ReentrantLock lock = new ReentrantLock();
    private final PageEvents events;
    private final Protection[] protections;

    private final PageTable table;
    private final LeaseTable leases;
    private final WrittenExtent extent;
    /** Set by {@link #close}, under the lock: calls that change the pool refuse from then on. */
    private boolean closed;
    private final SealedPages sealed;
    private final Quarantine quarantine;
    private final Guards guards;
    private final Shortfall shortfall = new Shortfall();
    private final PoolView view;
    private final HandOuts handOuts;
    private final Holds holds;
    private final DataAccess data;

    // Scratch, guarded by lock, so single-row allocations do not allocate.
    private final int[] oneTenant = new int[1];
    private final long[] oneHolder = new long[1];
    private final int[] oneCount = new int[1];
    private long step;

    private KvPagePool(PoolConfig config, PageMemory memory) {
        this.config = config;
        this.geometry = config.geometry();
        if (!geometry.equals(memory.geometry())) {
            throw new InvalidGeometryException("memory geometry " + memory.geometry() + " differs from pool geometry " + geometry);
        }
        this.memory = memory;
        this.tenants = new TenantRegistry(this::validateTenant);
        int pages = geometry.pageCount();
        this.table = new PageTable(pages, config.initialGeneration(), geometry.pageZeroReserved());
        this.admission = AdmissionLimits.compute(geometry, config.admission());
        if (admission.isLowered()) {
            LOG.log(System.Logger.Level.WARNING, "pool " + config.poolId() + ": the pool cannot hold one max-length request:"
                    + " advertised " + admission.advertisedTokens() + " tokens, pool holds " + admission.poolHoldsTokens()
                    + " tokens; admitting only requests up to " + admission.effectiveTokens() + " tokens");
        }
        PageSealerFactory factory = config.sealer();
        this.sealer = factory == null ? null
                : factory.create(new PageSealerFactory.Context(config.poolId(), config.rank(), geometry, memory, tenants));
        PoolGauges gauges = new PoolGauges(table, admission);
        this.metrics = new PoolMetrics(config.meterRegistry(), config.poolId(), config.rank(), gauges);
        this.events = new PageEvents(metrics, config.listeners().toArray(new PageEventListener[0]));
        ProtectionLevel[] levels = ProtectionLevel.values();
        this.protections = new Protection[levels.length];
        for (ProtectionLevel l : levels) {
            protections[l.ordinal()] = l.needsKeySource() && sealer == null ? null : l.bind(memory, sealer);
        }
        this.leases = new LeaseTable(pages, config.maxLeases(), config.maxClaims(), geometry.pageSizeTokens(), config.firstLeaseSerial(),
                events);
        gauges.bind(leases);
        this.extent = new WrittenExtent(pages, geometry.pageSizeTokens(), geometry.bufferCount());
        this.sealed = new SealedPages(table, sealer, events, metrics);
        this.guards = new Guards(tenants, geometry, table, events, metrics);
        scrubWholePool();
        this.quarantine = new Quarantine(table, sealed, events, metrics, memory, protections, config.quarantineMode(),
                config.protectionTimeoutNanos(), config.poolId() + "-rank" + config.rank(), LOG);
        this.view = new PoolView(lock, table, leases, sealed, extent);
        PoolParts parts = new PoolParts(geometry, memory, tenants, table, leases, extent, sealed, quarantine, events, metrics, guards,
                shortfall);
        this.handOuts = new HandOuts(this, parts);
        this.holds = new Holds(this, parts);
        this.data = new DataAccess(parts);
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
        int dirty = memory.scrubAndVerify(all, 0, pages, new int[pages]);
        if (dirty != 0) {
            throw new ProtectionException("start-up scrub left " + dirty + " of " + pages + " pages non-zero; refusing to start");
        }
    }

    private void validateTenant(String name, TenantPolicy policy) {
        if (policy.effectiveLevel(config.level()).needsKeySource() && sealer == null) {
            throw new IllegalArgumentException("tenant '" + name + "': " + ProtectionLevel.NO_SEALER_MESSAGE);
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

    /** Read-only, batch queries over pages and leases (the engine bridge's view of the page table). */
    public PoolView view() {
        return view;
    }

    /** The level a tenant's released pages get. */
    public ProtectionLevel levelOf(int tenant) {
        return tenants.policy(tenant).effectiveLevel(config.level());
    }

    /** The strategy of a tenant's level: what its released pages get, whether they stay reclaimable. */
    public Protection protectionOf(int tenant) {
        return protections[levelOf(tenant).ordinal()];
    }

    /** Adds a page-event listener. */
    public void addListener(PageEventListener listener) {
        add(listener, false);
    }

    /**
     * Adds the pool's audit trail: tenants whose level requires one get pages (and reader grants)
     * only while it records ({@link PageEventListener#notRecording}), checked at each hand-out.
     */
    public void attachAuditTrail(PageEventListener trail) {
        add(trail, true);
    }

    private void add(PageEventListener listener, boolean isAuditTrail) {
        lock.lock();
        try {
            events.add(listener, isAuditTrail);
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

    // ---------------------------------------------------------------- hand-outs

    /**
     * Why the last allocation answered "none": the tenant, the pages asked for, the step and the pages
     * available then, and the pool's page counts now; empty if it did not.
     */
    public String lastShortfall() {
        lock.lock();
        try {
            return shortfall.describe(table, this);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Hands {@code count} pages to {@code (tenant, holder)}, one lease of {@code kind} (a content
     * kind; NAMESPACE for namespace holders) each, into {@code leasesOut[outOffset..)}: all or
     * nothing. Sealed pages of others are cleared (and verified, when the tenant's level verifies).
     *
     * @return {@code false} ("none") if the pool or the tenant's quota cannot give them now, the
     *     pool unchanged ({@link #lastShortfall()} says why)
     * @throws ProtectionException if clearing sealed pages failed: they are scrubbed and retired
     */
    public boolean allocate(int tenant, long holder, LeaseKind kind, int count, long[] leasesOut, int outOffset) {
        lockOpen();
        try {
            oneTenant[0] = tenant;
            oneHolder[0] = holder;
            oneCount[0] = count;
            return handOuts.allocateRows(1, oneTenant, oneHolder, oneCount, kind, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * {@link #allocate} for a scheduler step's requests at once: row {@code r} gets {@code
     * counts[r]} pages for {@code (tenants[r], holders[r])}, leases in row order. All rows or none:
     * every row's tenant, holder and quota (one tenant's rows added up) is checked first.
     */
    public boolean allocateRows(int rows, int[] tenantsOfRows, long[] holders, int[] counts, LeaseKind kind, long[] leasesOut,
            int outOffset) {
        lockOpen();
        try {
            Guards.range("tenants", tenantsOfRows.length, 0, rows);
            Guards.range("holders", holders.length, 0, rows);
            Guards.range("counts", counts.length, 0, rows);
            return handOuts.allocateRows(rows, tenantsOfRows, holders, counts, kind, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * {@link #allocateRows} that also records the handed-out pages as written, as {@link
     * #markWritten} through each new lease right after would (same checks passed by construction,
     * same WRITE events, in row and page order): every page of row {@code r} whole, its last page
     * {@code [0, lastWritten[r])}. For engines that write KV themselves once pages are theirs (the
     * SGLang bridge records a step's {@code [prefix, seq)} this way). {@code kind} must be a writer
     * kind. All rows or none, as {@link #allocateRows}; on "none" nothing is recorded.
     */
    public boolean allocateRowsWritten(int rows, int[] tenantsOfRows, long[] holders, int[] counts, int[] lastWritten, LeaseKind kind,
            long[] leasesOut, int outOffset) {
        lockOpen();
        try {
            Guards.range("tenants", tenantsOfRows.length, 0, rows);
            Guards.range("holders", holders.length, 0, rows);
            Guards.range("counts", counts.length, 0, rows);
            if (lastWritten == null) {
                throw new IllegalArgumentException("lastWritten must not be null (allocateRows records nothing as written)");
            }
            return handOuts.allocateRows(rows, tenantsOfRows, holders, counts, lastWritten, kind, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Reclaims sealed pages for a prefix hit: each sealed reference
     * ({@link dev.kvshield.handle.PageHandles#sealedReference}) still sealed under {@code tenant} is
     * decrypted in place and handed to {@code (tenant, holder)} as a lease of {@code kind}; any other
     * (gone, another tenant's or an older generation, counted as a rejection, or over quota) answers
     * {@link dev.kvshield.lease.LeaseIds#NONE}: the engine recomputes.
     *
     * @return pages reclaimed
     * @throws ProtectionException if unsealing failed: every page it touched is scrubbed and retired
     */
    public int reclaim(int tenant, long holder, LeaseKind kind, long[] sealedRefs, int offset, int count, long[] leasesOut,
            int outOffset) {
        lockOpen();
        try {
            return handOuts.reclaim(tenant, holder, kind, sealedRefs, offset, count, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- holds

    /**
     * Adds a hold of {@code kind} for {@code (toTenant, toHolder)} on each page of the presented
     * leases, which {@code (tenant, holder)} holds as owner, namespace or reservation; the new leases
     * go to {@code leasesOut}. Holds of another tenant are readers of a
     * {@linkplain #declareSharedNamespace shared namespace}'s pages, never of a regulated tenant.
     *
     * @throws ForeignAccessException for a hold of another tenant the page's tenant does not allow
     * @throws dev.kvshield.lease.DuplicateLeaseException for a page listed twice, or already held by
     *     {@code toHolder} with {@code kind}
     */
    public void share(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, int toTenant, long toHolder,
            long[] leasesOut, int outOffset) {
        lockOpen();
        try {
            holds.share(tenant, holder, presented, offset, count, kind, toTenant, toHolder, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Hands the presented holds (owner, namespace, reservation, or a deferred free withdrawn) of
     * {@code (tenant, holder)} over to {@code toHolder} of the same tenant as leases of {@code kind},
     * in one step: the page never passes through having no hold. The presented leases are dead
     * afterwards.
     */
    public void transfer(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, long toHolder,
            long[] leasesOut, int outOffset) {
        lockOpen();
        try {
            holds.transfer(tenant, holder, presented, offset, count, kind, toHolder, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Takes a claim of {@code kind} for transfer {@code peer} on each page of the presented leases
     * (owner, namespace or reservation of {@code (tenant, holder)}): all or nothing. A claim keeps a
     * released page quarantined until it is dropped. The claims are held by {@code (tenant, holder)}.
     */
    public void claim(int tenant, long holder, long[] presented, int offset, int count, ClaimKind kind, long peer, long[] claimsOut,
            int outOffset) {
        lockOpen();
        try {
            holds.claim(tenant, holder, presented, offset, count, kind, peer, claimsOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Ends the presented content holds of {@code (tenant, holder)}: all or nothing. A page whose last
     * content hold this ends moves to its next generation at once, is quarantined, and has its
     * protection queued (or left waiting for its claims).
     *
     * @throws dev.kvshield.lease.LeaseException for a lease that is unknown, released, of another
     *     holder or of a claim kind, or listed twice — the pool unchanged
     */
    public void release(int tenant, long holder, long[] presented, int offset, int count, ReleaseReason reason) {
        lockOpen();
        try {
            holds.release(tenant, holder, presented, offset, count, reason, step);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Ends {@code (tenant, holder)}'s {@code kind} holds on {@code pages[offset, offset + count)} as
     * {@link #release} of those leases would, when it has one on every page; otherwise changes
     * nothing. Either way each page's lease (or {@link dev.kvshield.lease.LeaseIds#NONE}) is written to
     * {@code leasesOut[outOffset..)}, so an adapter refusing part of a free knows which. For an
     * adapter that names pages, not leases (SGLang frees slot indices): one lookup per page, the
     * lookup being the ownership check.
     *
     * @return true when every page was held and all were released; false when some page was not
     *     held (nothing released)
     * @throws dev.kvshield.lease.DuplicateLeaseException for a page of the pool listed twice, held or not — the
     *     pool unchanged (a page outside the pool is never held: false)
     * @throws IllegalArgumentException for a kind that holds no content, or a null reason
     */
    public boolean releaseHeldPages(int tenant, long holder, LeaseKind kind, int[] pages, int offset, int count,
            ReleaseReason reason, long[] leasesOut, int outOffset) {
        lockOpen();
        try {
            return holds.releaseHeldPages(tenant, holder, kind, pages, offset, count, reason, step, leasesOut, outOffset);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Checks exactly as {@link #release} would and changes nothing: an adapter composing several
     * pool calls into one operation refuses it whole before the first call.
     */
    public void checkHeld(int tenant, long holder, long[] presented, int offset, int count) {
        lock.lock();
        try {
            holds.checkHeld(tenant, holder, presented, offset, count);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Checks exactly as {@link #share} would and changes nothing: an adapter that must change the
     * pool before it shares (a prefix cache reclaiming a run's sealed blocks) refuses whole first.
     */
    public void checkShare(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, int toTenant,
            long toHolder) {
        lock.lock();
        try {
            holds.checkShare(tenant, holder, presented, offset, count, kind, toTenant, toHolder);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Refuses, changing nothing, as {@link #share} to {@code toTenant} would whatever it names: the reader's level requires an
     * audit trail that records and none does. For an adapter whose share will also name holds it must first make (a prefix
     * cache reclaiming a run's sealed blocks), beside {@link #checkShare} of the holds it presents now.
     */
    public void checkShareReader(int toTenant) {
        lock.lock();
        try {
            holds.checkShareReader(toTenant);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Refuses as a batch minting {@code leaseCount} leases ({@code claimCount} claims) would, and
     * changes nothing: a handoff reservation (pages, then claims) refuses whole before minting.
     */
    public void checkLeaseRoom(int leaseCount, int claimCount) {
        if (leaseCount < 0 || claimCount < 0 || claimCount > leaseCount) {
            throw new IllegalArgumentException("lease room: need 0 <= claims <= leases, got leases=" + leaseCount + " claims=" + claimCount);
        }
        lock.lock();
        try {
            leases.checkRoom(leaseCount, claimCount);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Reports a free an engine adapter refused because {@code (tenant, holder)} holds no lease on
     * {@code page} (a double or stale free of bare slot ids): counts and emits it, and returns the
     * exception naming the page's state and holders for the adapter to throw or log.
     */
    public ForeignAccessException refuseFree(int page, int tenant, long holder) {
        lockOpen();
        try {
            return holds.refuseFree(page, tenant, holder);
        } finally {
            lock.unlock();
        }
    }

    /** Drops claims of {@code (tenant, holder)}, live or fenced, on evidence their transfer is done: all or nothing. */
    public void dropClaims(int tenant, long holder, long[] claims, int offset, int count) {
        lockOpen();
        try {
            holds.dropClaims(tenant, holder, claims, offset, count, step);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Fences claims (their transfer expired): any later use fails, but each page stays claimed (so
     * quarantined) until the claim is dropped on evidence the transfer drained; never a free.
     */
    public void fenceClaims(int tenant, long holder, long[] claims, int offset, int count) {
        lockOpen();
        try {
            holds.fenceClaims(tenant, holder, claims, offset, count);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- data

    /**
     * Writes whole token slots of one buffer through a lease that may write (owner, namespace,
     * reservation, writer claim) and records them as written. A writer claim whose page was released
     * since writes into quarantine: the bytes are protected with the page and never count as written.
     */
    public void write(int tenant, long holder, long lease, int buffer, int slot, MemorySegment src) {
        lockOpen();
        try {
            data.write(tenant, holder, lease, buffer, slot, src);
        } finally {
            lock.unlock();
        }
    }

    /**
     * {@link #write} of every buffer at once: {@code srcByBuffer[b]} into buffer {@code b}, each the same
     * token slots, under one lease check; the slots are recorded as written once. Checked whole
     * before any byte moves.
     *
     * @throws dev.kvshield.geometry.InvalidGeometryException if there is not one source per buffer or
     *     they cover different numbers of tokens
     * @throws IllegalArgumentException for a null array or source; {@link IllegalStateException} for a
     *     source of a closed arena; {@link WrongThreadException} for one confined to another thread
     */
    public void writeAllBuffers(int tenant, long holder, long lease, int slot, MemorySegment[] srcByBuffer) {
        lockOpen();
        try {
            data.writeAllBuffers(tenant, holder, lease, slot, srcByBuffer);
        } finally {
            lock.unlock();
        }
    }

    /** Records slots {@code [fromSlot, toSlot)} as written through a lease, for engines and transports that write KV themselves. */
    public void markWritten(int tenant, long holder, long lease, int fromSlot, int toSlot) {
        lockOpen();
        try {
            data.markWritten(tenant, holder, lease, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    /** {@link #markWritten(int, long, long, int, int)} for every lease of a batch: all checked first, then all recorded. */
    public void markWritten(int tenant, long holder, long[] leases, int offset, int count, int fromSlot, int toSlot) {
        lockOpen();
        try {
            data.markWritten(tenant, holder, leases, offset, count, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Reads token slots of one buffer through a lease that may read (owner, namespace, reservation,
     * reader, reader claim); every slot must have been written in the page's current generation.
     *
     * @throws ReadBeforeWriteException naming the first unwritten slot
     * @throws StaleLeaseException for a reader claim whose page was released since it was taken
     */
    public void read(int tenant, long holder, long lease, int buffer, int slot, MemorySegment dst) {
        lockOpen();
        try {
            data.read(tenant, holder, lease, buffer, slot, dst);
        } finally {
            lock.unlock();
        }
    }

    /**
     * {@link #read} of every buffer at once, as an attention pass over a page's layers reads it:
     * {@code dstByBuffer[b]} from buffer {@code b}, each the same token slots, under one lease check
     * and one {@code READ} event for the page. Checked whole before any byte moves.
     *
     * @throws dev.kvshield.geometry.InvalidGeometryException if there is not one destination per buffer
     *     or they cover different numbers of tokens
     * @throws IllegalArgumentException for a null array or destination, or a read-only one;
     *     {@link IllegalStateException} for a destination of a closed arena; {@link WrongThreadException}
     *     for one confined to another thread
     * @throws ReadBeforeWriteException naming the first unwritten slot
     * @throws StaleLeaseException for a reader claim whose page was released since it was taken
     */
    public void readAllBuffers(int tenant, long holder, long lease, int slot, MemorySegment[] dstByBuffer) {
        lockOpen();
        try {
            data.readAllBuffers(tenant, holder, lease, slot, dstByBuffer);
        } finally {
            lock.unlock();
        }
    }

    /** True if a claim (live or fenced) wrote every slot of {@code [fromSlot, toSlot)} through itself. */
    public boolean claimWrote(long claim, int fromSlot, int toSlot) {
        lockOpen();
        try {
            return data.claimWrote(claim, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- step boundary, shred, halt

    /**
     * The step boundary: collects every protection batch queued at least {@code releaseLagSteps}
     * steps ago (waiting for any still running) into FREE or SEALED, retires pages that failed
     * verification or exhausted their generation, and scrubs and retires pages that failed.
     *
     * @return pages that became available at this boundary
     * @throws ProtectionException if a batch was not confirmed within the protection timeout; its
     *     pages stay quarantined and the next boundary waits for it again
     */
    public int endStep() {
        lockOpen();
        try {
            int made = quarantine.collect(step - config.releaseLagSteps(), false);
            step++;
            events.stepBoundary(step);
            return made;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Crypto-shreds a tenant: destroys its keys through the sealer and makes every page it sealed
     * unreclaimable (each reported as a {@code SHRED} event with its epoch), including pages whose
     * seal was issued but is collected only at the next step boundary.
     *
     * @return the number of sealed pages that became unrecoverable, those still being collected included
     */
    public int shredTenant(int tenant) {
        lockOpen();
        try {
            guards.tenant(tenant);
            if (sealer == null) {
                throw new IllegalStateException("pool " + config.poolId() + " has no key source; nothing to shred");
            }
            return sealed.shred(tenant) + quarantine.sealsInFlight(tenant);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Stops every hand-out (allocate, reclaim) until {@link #resumeHandOuts()}: used when the pool
     * cannot run safely, e.g. {@code COMPLIANCE} with an audit sink that cannot write.
     */
    public void haltHandOuts(String reason) {
        handOuts.halt(reason == null ? "halted" : reason);
        LOG.log(System.Logger.Level.ERROR, "pool " + config.poolId() + " stopped handing out pages: " + reason);
    }

    /**
     * Ends a {@link #haltHandOuts} halt. A tenant whose level requires an audit trail still gets
     * nothing while no attached trail records (that check is not a halt and cannot be lifted).
     */
    public void resumeHandOuts() {
        handOuts.halt(null);
    }

    /**
     * Declares a tenant a shared namespace (an operator's public system prompt): non-regulated
     * tenants may read its pages, still protected at release under its own level and key.
     */
    public void declareSharedNamespace(int tenant) {
        lockOpen();
        try {
            guards.declareShared(tenant);
        } finally {
            lock.unlock();
        }
    }

    /** Whether {@code tenant} was {@linkplain #declareSharedNamespace declared} a shared namespace. */
    public boolean isSharedNamespace(int tenant) {
        lock.lock();
        try {
            guards.tenant(tenant);
            return guards.isShared(tenant);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- state

    /** Pages {@code allocate} can hand out now: free, sealed, and queued for protection. */
    public int available() {
        lock.lock();
        try {
            return available0();
        } finally {
            lock.unlock();
        }
    }

    int available0() {
        return table.freeCount() + sealed.size() + quarantine.queuedReusable();
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

    /** The step counter; the caller holds the lock. */
    long step0() {
        return step;
    }

    PoolSnapshot snapshot0() {
        int quarantined = table.count(PageState.QUARANTINED);
        return new PoolSnapshot(table.count(PageState.FREE), table.count(PageState.SEALED), table.count(PageState.OWNED),
                quarantined, table.count(PageState.RETIRED), quarantine.awaitingClaims(),
                quarantined - quarantine.awaitingClaims() - quarantine.failed(), quarantine.failed(), leases.claimedPages(),
                leases.liveClaims(), leases.fencedClaims(), available0(), step);
    }

    /** Pages owned by a tenant (quota accounting). */
    public int ownedBy(int tenant) {
        lock.lock();
        try {
            guards.tenant(tenant);
            return table.ownedBy(tenant);
        } finally {
            lock.unlock();
        }
    }

    /**
     * A digest of every page's state, generation, tenant and extent, every lease, the free-list
     * order, the sealed pages, the quarantine and the step: equal before and after a rejected call.
     */
    public long stateDigest() {
        lock.lock();
        try {
            long h = table.digest(17);
            for (int p = 0; p < geometry.pageCount(); p++) {
                h = extent.digest(h, p);
            }
            h = leases.digest(h);
            h = sealed.digest(h);
            h = quarantine.digest(h);
            return Digests.mix(h, step);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Takes the pool lock for a call that changes the pool or touches its memory; throws, lock not
     * held, once the pool is closed (its quarantine and sealer are gone, the memory may be too).
     */
    private void lockOpen() {
        lock.lock();
        if (closed) {
            lock.unlock();
            throw new IllegalStateException("pool " + config.poolId() + " rank " + config.rank() + " is closed");
        }
    }

    /**
     * Stops the protection worker (after finishing its current batch). Does not close the memory.
     * Every later call that would change the pool or touch its memory throws IllegalStateException;
     * reads of its state (views, snapshots, digests) still answer.
     */
    @Override
    public void close() {
        lock.lock();
        try {
            closed = true;
        } finally {
            lock.unlock();
        }
        quarantine.close();
        if (sealer != null) {
            sealer.close();
        }
    }
}
