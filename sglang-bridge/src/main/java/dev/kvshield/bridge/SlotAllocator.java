package dev.kvshield.bridge;

import dev.kvshield.KvShieldException;
import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RequestOutcome;
import dev.kvshield.bridge.memory.EngineBuffers;
import dev.kvshield.bridge.memory.ExternalMemoryProvider;
import dev.kvshield.bridge.memory.PageMemoryProvider;
import dev.kvshield.bridge.memory.PageMemoryProviders;
import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PrometheusEndpoint;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.pool.PoolView;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Map;

/**
 * SGLang's KV allocator contract on a {@link KvPagePool}: token slots in, token slots out, through
 * two shared direct buffers the Python side binds once ({@link #bind}), every page held through a
 * lease of the pool and every free presented as the leases of the one who frees.
 *
 * <ul>
 *   <li>A token slot is {@code page * pageSizeTokens + offset}; page 0 is reserved (SGLang writes
 *       padded tokens' dummy outputs there) and never handed out.
 *   <li>The {@code io} buffer carries slots: allocations write them from index 0, {@link #free}
 *       reads them from index 0.
 *   <li>The {@code plan} buffer carries the step's host-side plan, {@value #PLAN_ROW} longs per
 *       request: request id (the bridge's own id of one SGLang request object; -1: unknown, held by
 *       {@link #UNATTRIBUTED}, always the default tenant's), tenant id, prefix length, sequence length,
 *       slot of the prefix's last token (-1: not known host-side; taken from the request's page list).
 *       A request has one row at most. A row's new pages are the request's {@code OWNER} leases, all
 *       rows in one all-or-nothing pool call, and each row's {@code [prefix, seq)} is recorded as
 *       written (the allocator never sees KV writes). The buffer is only read.
 *   <li>A request id ({@code [0, 2^62 - 2)}; -1 only where a method says so) belongs to one tenant,
 *       the tenant of the pages it holds here: a plan row or {@link #recordRequestPages} naming it
 *       with another tenant throws {@link ForeignAccessException}, nothing changed. A free, adoption
 *       or release naming it with another tenant presents that tenant's holds, which it has none of:
 *       refused page by page like any foreign free.
 *   <li>Per request, the pages it holds are kept in position order (page {@code k} holds its tokens
 *       {@code [k * pageSizeTokens, (k + 1) * pageSizeTokens)}), so an extension finds the prefix's
 *       partial page and {@link #freeSegment} finds a row segment's pages host-side: page ids never
 *       need to come back from the device.
 *   <li>Frees carry no leases, so the allocator presents the freeing holder's own: in a request's
 *       release, that request's leases on the freed pages; elsewhere (SGLang's prefix tree
 *       evicting), the cache namespace's ({@link #ENGINE_CACHE}, into which {@link
 *       #adoptIntoCache} moved a request's pages) or {@link #UNATTRIBUTED}'s. A page the freeing
 *       holder does not hold (a double or stale free, another request's or tenant's page, page 0) is
 *       refused: counted, audited and named by the pool ({@link KvPagePool#refuseFree}), and never
 *       applied; in production mode the rest of the free goes on, in strict mode nothing is released
 *       and the refusal is thrown. Out-of-range slots always throw, nothing released.
 *   <li>Every batch call takes {@code flags}; {@link #STEP_BOUNDARY} runs the pool's step boundary
 *       first, so a scheduler step costs one crossing. The boundary is the step's: it runs even when
 *       the call's own arguments are then refused.
 *   <li>A refused argument throws naming the value and leaves the pool, the page lists and the
 *       counters as they were. After {@link #close} every call that reads or changes the pool throws
 *       {@link IllegalStateException}.
 * </ul>
 *
 * <p>Called from one scheduler thread; not thread-safe. Allocation and free do not allocate Java
 * objects except on refusals.
 *
 * <p>Implementation notes: the allocator keeps no copy of the pool's state: who holds a page is the
 * pool's answer ({@link dev.kvshield.pool.PoolView}, one batch lookup per call), and what the
 * allocator keeps of its own is the engine's view, each request's pages by position.
 */
public final class SlotAllocator implements AutoCloseable {
    /** Flag: run the pool's step boundary before the call. */
    public static final int STEP_BOUNDARY = 1;
    /**
     * Flag of a request's free: SGLang is inside a free group ({@code free_group_begin/end}); the
     * pages become deferred frees of the request ({@code DEFERRED_FREE} leases, off its page list)
     * and are released together at {@link #endFreeGroup}.
     */
    public static final int IN_FREE_GROUP = 2;
    /**
     * Flag of a free outside any request's release: SGLang's tree cache is evicting, so the free
     * presents the cache's leases ({@link #ENGINE_CACHE}). Without it such a free presents only
     * unattributed holds: a stale free of slots the cache holds is refused like any other.
     */
    public static final int CACHE_EVICTION = 4;
    /** Longs per plan row. */
    public static final int PLAN_ROW = 5;
    /** Holder of pages allocated with no plan row (counted in {@link #unattributedPages()}): {@link Owners#UNATTRIBUTED}. */
    public static final long UNATTRIBUTED = Owners.UNATTRIBUTED;
    /**
     * Holder of the engine cache's evictions inside SGLang's free group until the group ends (a deferred
     * free is a request-kind hold): a request id no request gets either.
     */
    static final long CACHE_EVICTED_IN_GROUP = Owners.request((1L << 62) - 2);
    /** Request ids at or above this one are the pool's own holders, never a request's. */
    private static final long FIRST_RESERVED_REQUEST = Owners.id(CACHE_EVICTED_IN_GROUP);
    /**
     * Holder of the pages SGLang's own prefix cache (its radix tree) keeps after their request
     * ({@link #adoptIntoCache}): only a free flagged {@link #CACHE_EVICTION} presents its leases.
     */
    public static final long ENGINE_CACHE = Owners.namespace(1);
    /** Bytes per audit file before the trail rotates to the next one. */
    private static final long AUDIT_FILE_BYTES = 256L << 20;

    private final KvPagePool pool;
    private final PoolView view;
    private final PageMemory memory;
    private final boolean ownsMemory;
    private final boolean strict;
    private final int pageSizeTokens;
    private final int pageCount;
    private final long slotCount;
    private final int defaultTenant;

    // Scratch, so batch calls do not allocate.
    private final long[] leases;
    private final long[] moved;
    private final int[] pages;
    private final int[] tenants;
    private final int[] mark;
    private int stamp;
    private final long[] groupLeases;
    private final int[] groupTenants;
    private final long[] groupHolders;
    private int groupCount;
    private int[] rowTenants = new int[0];
    private long[] rowHolders = new long[0];
    private int[] rowCounts = new int[0];

    // Per-request page lists: doubly linked through the pages, highest position first; the head of
    // each request's list and its tenant in an open-addressing map (linear probing) keyed by request id. A page is
    // in at most one list: the request that holds it as owner. Pages that left their request another
    // way (a handoff refusal, the kvshield prefix cache) are dropped lazily on the next walk.
    private final int[] nextOfPage;
    private final int[] prevOfPage;
    private final int[] positionOfPage;
    private final long[] listOfPage;
    private final long[] listKeys;
    private final int[] listHeads;
    private final int[] listTenants;
    private final int listMask;

    private LongBuffer io;
    private LongBuffer plan;
    private long rejectedFrees;
    private long unattributedPages;
    private long planMismatches;
    private String lastRejection = "";
    private final PrometheusEndpoint metricsEndpoint;
    private final AuditTrail auditTrail;
    /** The lock on this pool and rank's trails in the audit directory ({@link #lockTrails}), null without a trail. */
    private final FileChannel auditLock;
    /** What a closed allocator's refusals call it. */
    private final String name;
    private boolean closed;

    SlotAllocator(BridgeSettings settings, PoolGeometry geometry, PageMemory memory, boolean ownsMemory, PageSealerFactory sealer) {
        PoolConfig.Builder b = PoolConfig.builder(geometry).level(settings.level).quarantineMode(settings.quarantine)
                .releaseLagSteps(settings.releaseLagSteps).rank(settings.rank).poolId(settings.poolId)
                .admission(new AdmissionPolicy(settings.advertisedContextTokens, settings.headroomFraction, settings.strictAdmission));
        if (sealer != null) {
            b.sealer(sealer);
        }
        PrometheusMeterRegistry prometheus = settings.metricsBasePort > 0 ? new PrometheusMeterRegistry(PrometheusConfig.DEFAULT) : null;
        if (prometheus != null) {
            b.meterRegistry(prometheus);
        }
        this.pool = KvPagePool.create(b.build(), memory);
        this.view = pool.view();
        // NOTE: a step that throws undoes the ones before it, so a refused setting leaves no port bound, no worker running
        AuditTrail trail = null;
        PrometheusEndpoint endpoint = null;
        FileChannel lock = null;
        try {
            lock = settings.auditDir == null ? null : lockTrails(settings);
            trail = settings.auditDir == null ? null : attachAudit(pool, settings);
            endpoint = prometheus == null ? null : startMetrics(prometheus, settings);
            this.defaultTenant = pool.tenants().register(settings.defaultTenant);
        } catch (RuntimeException e) {
            if (endpoint != null) {
                endpoint.close();
            }
            try {
                pool.close();
            } finally {
                if (trail != null) {
                    trail.close();
                }
                unlock(lock);
            }
            throw e;
        }
        this.auditTrail = trail;
        this.auditLock = lock;
        this.metricsEndpoint = endpoint;
        this.name = "SlotAllocator of pool " + settings.poolId + " rank " + settings.rank;
        this.memory = memory;
        this.ownsMemory = ownsMemory;
        this.strict = settings.strict;
        this.pageSizeTokens = geometry.pageSizeTokens();
        this.pageCount = geometry.pageCount();
        this.slotCount = (long) pageCount * pageSizeTokens;
        leases = new long[pageCount];
        moved = new long[pageCount];
        pages = new int[pageCount];
        tenants = new int[pageCount];
        mark = new int[pageCount];
        groupLeases = new long[pageCount];
        groupTenants = new int[pageCount];
        groupHolders = new long[pageCount];
        nextOfPage = new int[pageCount];
        prevOfPage = new int[pageCount];
        positionOfPage = new int[pageCount];
        listOfPage = new long[pageCount];
        java.util.Arrays.fill(listOfPage, -1);
        int capacity = Integer.highestOneBit(Math.max(16, pageCount) * 2 - 1) * 2;
        listKeys = new long[capacity];
        java.util.Arrays.fill(listKeys, -1);
        listHeads = new int[capacity];
        listTenants = new int[capacity];
        listMask = capacity - 1;
    }

    /**
     * An exclusive lock on this pool and rank's trails in the audit directory ({@link AuditSink#poolTrailLock}), held while
     * its trail is open. Another server given the same directory whose ranks name their pools alike (the bridge names a
     * pool by its rank) would write its trail there as another boot of this one, shipping checkpoints between this
     * trail's, and {@code audit verify --shipped} would then fail this whole trail as an older boot's. Refused naming
     * the directory, pool and rank; a restart (this trail closed) takes the lock again.
     */
    private static FileChannel lockTrails(BridgeSettings settings) {
        Path file = settings.auditDir.resolve(AuditSink.poolTrailLock(settings.poolId, settings.rank));
        FileChannel channel;
        FileLock held;
        try {
            Files.createDirectories(settings.auditDir);
            channel = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE);
        } catch (IOException e) {
            throw new IllegalArgumentException(BridgeSettings.AUDIT_DIR + " " + settings.auditDir + " cannot be used: " + e);
        }
        try {
            held = channel.tryLock();
        } catch (OverlappingFileLockException e) {
            held = null; // NOTE: this JVM holds it: another allocator of the same pool and rank
        } catch (IOException e) {
            unlock(channel);
            throw new IllegalArgumentException(BridgeSettings.AUDIT_DIR + " " + settings.auditDir + " cannot be locked: " + e);
        }
        if (held == null) {
            unlock(channel);
            throw new IllegalArgumentException(BridgeSettings.AUDIT_DIR + " " + settings.auditDir + " already has a writer of pool "
                    + settings.poolId + " rank " + settings.rank + "'s trails (it holds " + file.getFileName() + "): another"
                    + " server whose ranks name their pools alike writes there; give each server its own directory");
        }
        return channel;
    }

    private static void unlock(FileChannel lock) {
        if (lock != null) {
            try {
                lock.close(); // NOTE: releases the lock
            } catch (IOException e) {
                // NOTE: nothing to undo: a channel that failed to close holds no lock past its process
            }
        }
    }

    /**
     * The pool's signed audit trail: rotating files {@code audit-<poolId>-r<rank>-boot<n>} in the audit
     * directory, {@code n} the first boot number no trail there uses (a trail is never appended to, so a
     * restarted server starts its own beside the earlier ones), checkpoints signed with the configured key.
     * Fails naming the setting if either cannot be used (a compliance pool never runs without its trail).
     */
    private static AuditTrail attachAudit(KvPagePool pool, BridgeSettings settings) {
        try {
            AuditKeys.SigningKey key = AuditKeys.loadSigningKey(settings.auditSigningKey);
            int boot = 1;
            while (AuditSink.holdsTrail(settings.auditDir, AuditSink.poolTrailPrefix(settings.poolId, settings.rank, boot))) {
                boot++;
            }
            AuditSink sink = AuditSink.rotatingFiles(settings.auditDir, AuditSink.poolTrailPrefix(settings.poolId, settings.rank,
                    boot), AUDIT_FILE_BYTES);
            // NOTE: SGLang's attention kernels read KV directly, never through the pool: a hand-out is judged as a read
            AuditConfig.Builder config = AuditConfig.builder().sink(sink).signingKey(key).readsRecorded(false)
                    .checkpointEveryMillis(settings.auditCheckpointSeconds * 1_000);
            settings.auditShippers.forEach(config::shipper);
            return AuditTrail.attach(pool, config.build());
        } catch (IOException e) {
            throw new IllegalArgumentException(BridgeSettings.AUDIT_SIGNING_KEY + "/" + BridgeSettings.AUDIT_DIR
                    + " cannot be used: " + e.getMessage());
        }
    }

    /**
     * Opens an allocator over the engine's KV buffers: every buffer that holds KV data at the
     * allocator's token slots (target and draft pools, K/V, latent, scale, indexer, workspace
     * buffers), each with its own bytes per token, in the order given (the buffer's number, which
     * the sealer's nonce carries).
     *
     * @param settings see {@link BridgeSettings}
     * @param pageSizeTokens SGLang's page size (1 for the token allocator)
     * @param pageCount pages per buffer, page 0 included ({@code size / pageSize + 1})
     * @param kinds each buffer's {@link BufferKind} name
     * @param labels each buffer's label (what the engine calls it; unique; it appears in messages)
     * @param bytesPerToken each buffer's bytes per token slot
     * @param addresses each buffer's data pointer
     * @param byteSizes each buffer's size in bytes
     * @param deviceIndex the buffers' device ordinal, -1 for host memory
     * @param streamHandle the engine's CUDA stream (0: legacy default stream; ignored for host memory)
     * @param eventHandles one CUDA event per further engine stream, re-recorded at each forward
     *     launch (empty for host memory); protection work waits on them
     * @throws IllegalArgumentException if the per-buffer arrays differ in length or a kind is unknown
     *     (the message names it)
     */
    public static SlotAllocator open(Map<String, String> settings, int pageSizeTokens, int pageCount, String[] kinds,
            String[] labels, int[] bytesPerToken, long[] addresses, long[] byteSizes, int deviceIndex, long streamHandle,
            long[] eventHandles) {
        BridgeSettings s = BridgeSettings.parse(settings);
        if (labels.length != kinds.length || bytesPerToken.length != kinds.length) {
            throw new IllegalArgumentException(kinds.length + " kinds, " + labels.length + " labels and " + bytesPerToken.length
                    + " bytes-per-token entries: one of each per buffer");
        }
        PoolGeometry.Builder g = PoolGeometry.builder().pageSizeTokens(pageSizeTokens).pageCount(pageCount);
        for (int b = 0; b < kinds.length; b++) {
            g.buffer(kindNamed(kinds[b], labels[b]), labels[b], bytesPerToken[b]);
        }
        PoolGeometry geometry = g.build();
        PageMemoryProvider provider = PageMemoryProviders.byName(s.backend);
        PageMemory memory = provider.open(geometry,
                new EngineBuffers(addresses, byteSizes, deviceIndex, streamHandle, eventHandles));
        try {
            return new SlotAllocator(s, geometry, memory, true, sealer(s, provider));
        } catch (RuntimeException e) {
            memory.close();
            throw e;
        }
    }

    private static BufferKind kindNamed(String kind, String label) {
        try {
            return BufferKind.valueOf(kind);
        } catch (IllegalArgumentException | NullPointerException e) {
            throw new IllegalArgumentException("buffer " + label + " has kind " + kind + "; known: "
                    + java.util.Arrays.toString(BufferKind.values()));
        }
    }

    /** An allocator over memory the caller built (tests, simulations); the caller closes the memory. */
    public static SlotAllocator create(Map<String, String> settings, PoolGeometry geometry, PageMemory memory) {
        BridgeSettings s = BridgeSettings.parse(settings);
        return new SlotAllocator(s, geometry, memory, false, sealer(s, new ExternalMemoryProvider()));
    }

    /** The configured sealer factory, else the backend's own sealer over the configured root key, else none. */
    private static PageSealerFactory sealer(BridgeSettings s, PageMemoryProvider provider) {
        if (s.sealerFactory != null) {
            return s.sealerFactory;
        }
        return s.rootKey != null ? provider.sealerFactory(s.rootKey) : null;
    }

    /**
     * Binds the shared buffers: {@code io} must hold every slot of the pool, {@code plan} any
     * number of whole rows; both are read in native byte order.
     */
    public void bind(ByteBuffer ioBuffer, ByteBuffer planBuffer) {
        checkOpen();
        if (!ioBuffer.isDirect() || !planBuffer.isDirect()) {
            throw new IllegalArgumentException("io and plan must be direct buffers");
        }
        LongBuffer i = ioBuffer.order(ByteOrder.nativeOrder()).asLongBuffer();
        if (i.capacity() < slotCount) {
            throw new IllegalArgumentException("io buffer holds " + i.capacity() + " slots; the pool has " + slotCount);
        }
        this.io = i;
        this.plan = planBuffer.order(ByteOrder.nativeOrder()).asLongBuffer();
    }

    /** The tenant id of a tenant name, registering it (default policy) on first use. */
    public int tenantId(String name) {
        checkOpen();
        // NOTE: a tenant registered on the pool with its own policy (a quota, a level) keeps it
        try {
            return pool.tenants().idOf(name);
        } catch (dev.kvshield.tenant.UnknownTenantException e) {
            return pool.tenants().register(name);
        }
    }

    /** The name of a registered tenant id. */
    public String tenantName(int tenant) {
        checkOpen();
        return pool.tenants().name(tenant);
    }

    public int defaultTenant() {
        return defaultTenant;
    }

    // ---------------------------------------------------------------- allocate

    /**
     * SGLang's {@code alloc(need_size)}: {@code slots / pageSizeTokens} whole pages, their slots
     * written to {@code io[0, slots)}. Plan rows (if any) whose new pages add up to the request
     * attribute the pages; otherwise they go to the default tenant, {@link #UNATTRIBUTED}.
     *
     * @return {@code slots}, or -1 when the pool (or a tenant's quota) cannot give them, or when
     *     {@code slots} is more than the pool holds (SGLang's {@code None}); nothing changed
     * @throws IllegalArgumentException for a refused size or plan (see the class notes on plan rows); nothing changed
     */
    public long alloc(long slots, int planRows, int flags) {
        enter(flags);
        checkBound();
        if (slots <= 0 || slots % pageSizeTokens != 0) {
            throw new IllegalArgumentException("alloc needs a positive multiple of the page size " + pageSizeTokens
                    + ": need_size=" + slots);
        }
        checkPlan(planRows);
        if (slots > slotCount) {
            return -1;
        }
        int need = (int) (slots / pageSizeTokens);
        long planned = 0;
        for (int r = 0; r < planRows; r++) {
            planned += newPages(plan.get(r * PLAN_ROW + 2), plan.get(r * PLAN_ROW + 3));
        }
        boolean attributed = planRows > 0 && planned == need;
        if (attributed) {
            if (!allocatePlannedRows(planRows)) {
                return -1;
            }
        } else {
            if (!allocateUnattributed(need)) {
                return -1;
            }
            unattributedPages += need;
            planMismatches += planRows > 0 ? 1 : 0; // NOTE: counted once the call succeeded: a refused one changes nothing
        }
        long[] out = slotScratch((int) slots);
        if (pageSizeTokens == 1) {
            for (int i = 0; i < need; i++) {
                out[i] = pages[i];
            }
        } else {
            int o = 0;
            for (int i = 0; i < need; i++) {
                long base = (long) pages[i] * pageSizeTokens;
                for (int k = 0; k < pageSizeTokens; k++) {
                    out[o++] = base + k;
                }
            }
        }
        io.put(0, out, 0, (int) slots);
        return slots;
    }

    /**
     * SGLang's paged {@code alloc_extend} (and {@code alloc_decode}, a plan with {@code prefix =
     * seq - 1}): for each plan row in order, the rest of the prefix's last partial page first
     * (slots after {@code lastLoc}), then whole new pages, then a new partial page, written to
     * {@code io[0, extendTokens)}.
     *
     * <p>A row whose {@code last_loc} is -1 takes it from its request's page list (the request's
     * page at the prefix's last position), so SGLang's device-side {@code last_loc} is never read.
     *
     * @return {@code extendTokens}; -1 when the pool cannot give the new pages; -2 when a row needs
     *     {@code last_loc} and its request holds no page at that position here (unattributed rows):
     *     the caller passes it explicitly. Nothing changed in either case, the plan buffer included
     *     (a derived {@code last_loc} is never written back).
     * @throws IllegalArgumentException for a plan that does not add up, or two rows extending one partial
     *     page; ForeignAccessException for a partial page the row's holder does not hold (nothing changed)
     */
    public long allocExtend(int planRows, long extendTokens, int flags) {
        enter(flags);
        checkBound();
        checkPlan(planRows);
        if (extendTokens < 0 || extendTokens > slotCount) {
            throw new IllegalArgumentException("extend_num_tokens must be in [0, " + slotCount + "]: " + extendTokens);
        }
        if (!lastLocs(planRows)) {
            return -2;
        }
        long tokens = 0;
        int s = nextStamp();
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            tokens += seq - prefix;
            if (partialFill(prefix, seq) > 0) {
                rowPartial[r] = partialPageLease(r, rowLastLoc[r], prefix);
                int page = (int) (rowLastLoc[r] / pageSizeTokens);
                if (mark[page] == s) { // NOTE: unattributed rows share one holder: only their pages can tell them apart
                    throw new IllegalArgumentException("plan row " + r + " extends partial page " + page + " (last_loc="
                            + rowLastLoc[r] + ") which an earlier row extends too: its slots would be handed out twice");
                }
                mark[page] = s;
            }
        }
        if (tokens != extendTokens) {
            throw new IllegalArgumentException("plan rows extend " + tokens + " tokens but extend_num_tokens=" + extendTokens);
        }
        if (!allocatePlannedRows(planRows)) {
            return -1;
        }
        long[] slotsOut = slotScratch((int) extendTokens);
        int out = 0;
        int h = 0;
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            long lastLoc = rowLastLoc[r];
            int fill = partialFill(prefix, seq);
            if (fill > 0) {
                int from = (int) (prefix % pageSizeTokens);
                pool.markWritten(rowTenants[r], rowHolders[r], rowPartial[r], from, from + fill);
                for (int k = 1; k <= fill; k++) {
                    slotsOut[out++] = lastLoc + k;
                }
            }
            long pos = prefix + fill;
            while (pos < seq) {
                long base = (long) pages[h++] * pageSizeTokens;
                long n = Math.min(pageSizeTokens, seq - pos);
                for (int k = 0; k < n; k++) {
                    slotsOut[out++] = base + k;
                }
                pos += n;
            }
        }
        io.put(0, slotsOut, 0, out);
        return extendTokens;
    }

    /**
     * Each row's {@code last_loc} into {@code rowLastLoc}: the plan's, or for -1 where a partial page needs it, the slot its
     * request's page list names; false if one is not known here. The caller's plan is only read.
     */
    private boolean lastLocs(int planRows) {
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            long lastLoc = plan.get(o + 4);
            if (lastLoc == -1 && partialFill(prefix, plan.get(o + 3)) > 0) {
                int page = plan.get(o) < 0 ? -1 : listedPageAt(plan.get(o), (prefix - 1) / pageSizeTokens);
                if (page < 0) {
                    return false;
                }
                lastLoc = (long) page * pageSizeTokens + (prefix - 1) % pageSizeTokens;
            }
            rowLastLoc[r] = lastLoc;
        }
        return true;
    }

    /** Slots of the prefix's last partial page the extension fills. */
    private int partialFill(long prefix, long seq) {
        long pageEnd = ceilDiv(prefix, pageSizeTokens) * pageSizeTokens;
        return (int) (Math.min(seq, pageEnd) - prefix);
    }

    private long newPages(long prefix, long seq) {
        return ceilDiv(seq, pageSizeTokens) - ceilDiv(prefix, pageSizeTokens);
    }

    private static long ceilDiv(long a, long b) {
        return (a + b - 1) / b;
    }

    /** The row's holder's lease on the partial page {@code last_loc} names; refuses a page it does not hold. */
    private long partialPageLease(int row, long lastLoc, long prefix) {
        if (lastLoc < 0 || lastLoc >= slotCount || (lastLoc + 1) % pageSizeTokens != prefix % pageSizeTokens) {
            throw new IllegalArgumentException("plan row " + row + ": last_loc=" + lastLoc + " does not end a prefix of " + prefix
                    + " tokens in pages of " + pageSizeTokens + " slots (pool has " + slotCount + " slots)");
        }
        int o = row * PLAN_ROW;
        int page = (int) (lastLoc / pageSizeTokens);
        int tenant = (int) plan.get(o + 1);
        long holder = holderOf(plan.get(o));
        long lease = view.leaseOf(page, tenant, holder, LeaseKind.OWNER);
        if (lease == LeaseIds.NONE) {
            throw new ForeignAccessException("plan row " + row + " would extend page " + page + " (last_loc=" + lastLoc
                    + "), which its request does not hold; nothing was allocated: " + pool.refuseFree(page, tenant, holder).getMessage());
        }
        return lease;
    }

    /**
     * Refuses, before anything changes, a plan whose rows are not all well formed, whose unattributed row (-1) is not the
     * default tenant's (the only tenant whose unattributed holds a free presents), whose request row names a tenant the
     * request is not ({@link #checkRequestTenant}), or that names one request in two rows (its pages would be listed twice
     * at one position, its partial page handed out twice).
     */
    private void checkPlan(int planRows) {
        if (planRows < 0 || (long) planRows * PLAN_ROW > plan.capacity()) {
            throw new IllegalArgumentException("plan rows must be in [0, " + plan.capacity() / PLAN_ROW + "]: " + planRows);
        }
        growRowScratch();
        int seenMask = (Integer.highestOneBit(Math.max(1, planRows) * 2 - 1) << 1) - 1;
        java.util.Arrays.fill(rowSeen, 0, seenMask + 1, -1);
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long id = plan.get(o);
            long tenant = plan.get(o + 1);
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            if (id < -1 || id >= FIRST_RESERVED_REQUEST || tenant < 0 || tenant > Integer.MAX_VALUE
                    || !pool.tenants().isRegistered((int) tenant) || prefix < 0 || seq < prefix || seq > slotCount) {
                throw new IllegalArgumentException("plan row " + r + " is invalid: request=" + id + " tenant=" + tenant + " prefix="
                        + prefix + " seq=" + seq + " (request in [0, " + FIRST_RESERVED_REQUEST + ") or -1 for unattributed, a"
                        + " registered tenant, 0 <= prefix <= seq <= " + slotCount + ")");
            }
            if (id == -1 && tenant != defaultTenant) {
                throw new IllegalArgumentException("plan row " + r + " is unattributed (request -1) but names tenant " + tenant
                        + "; unattributed pages are the default tenant's (" + defaultTenant + "): name the request instead");
            }
            if (id >= 0) {
                checkRequestTenant(id, tenant);
                int i = mix(id) & seenMask;
                while (rowSeen[i] >= 0 && rowSeen[i] != id) {
                    i = (i + 1) & seenMask;
                }
                if (rowSeen[i] == id) {
                    throw new IllegalArgumentException("plan row " + r + " names request " + id + " which an earlier row names"
                            + " too: one row per request");
                }
                rowSeen[i] = id;
            }
        }
    }

    /** Sizes the per-row scratch for the bound plan buffer's rows (grown once per larger buffer). */
    private void growRowScratch() {
        int rows = Math.max(1, plan.capacity() / PLAN_ROW);
        if (rowTenants.length >= rows) {
            return;
        }
        rowTenants = new int[rows];
        rowHolders = new long[rows];
        rowCounts = new int[rows];
        rowLastWritten = new int[rows];
        rowLastLoc = new long[rows];
        rowPartial = new long[rows];
        rowSeen = new long[Integer.highestOneBit(rows * 2 - 1) << 1];
    }

    /** The holder of a plan row's or an engine free's request: -1 is {@link #UNATTRIBUTED}, else {@link #requestHolder}. */
    private static long holderOf(long requestId) {
        return requestId == -1 ? UNATTRIBUTED : requestHolder(requestId);
    }

    /**
     * The pool holder of request {@code requestId}: the one check of a request id every bridge entry
     * point shares, so no caller's request can pose as one of the pool's own holders.
     *
     * @throws IllegalArgumentException naming the id unless it is in {@code [0, 2^62 - 2)} (ids from
     *     {@code 2^62 - 2} are the pool's own holders: {@link #UNATTRIBUTED} and the cache's evictions
     *     inside a free group)
     */
    public static long requestHolder(long requestId) {
        if (requestId < 0 || requestId >= FIRST_RESERVED_REQUEST) {
            throw new IllegalArgumentException("request id " + requestId + " names no request: a request's id is in [0, "
                    + FIRST_RESERVED_REQUEST + ") (above: the pool's own holders)");
        }
        return Owners.request(requestId);
    }

    /**
     * Throws unless this allocator is open and {@link #recordRequestPages} would list pages of {@code tenant} for request
     * {@code requestId} (a request's id, the request not another tenant's): the checks alone, for a bridge that must refuse
     * before it changes the pool.
     */
    public void checkListable(long requestId, int tenant) {
        checkOpen();
        requestHolder(requestId);
        checkRequestTenant(requestId, tenant);
    }

    /**
     * Refuses {@code tenant} naming request {@code requestId} when the request is another tenant's: a request id belongs to
     * the tenant of the pages it holds here (its page list's tenant) for as long as it holds any. For plan rows, which
     * write and read the page list for a tenant; the other calls present the tenant's leases, which the pool refuses.
     */
    private void checkRequestTenant(long requestId, long tenant) {
        int owner = listTenant(requestId);
        if (owner >= 0 && owner != tenant) {
            throw new ForeignAccessException("request " + requestId + " is tenant " + owner + "'s (" + tenantName(owner)
                    + "), not tenant " + tenant + "'s" + (tenant >= 0 && tenant < Integer.MAX_VALUE
                    && pool.tenants().isRegistered((int) tenant) ? " (" + tenantName((int) tenant) + ")" : "")
                    + "; nothing changed");
        }
    }

    // ---------------------------------------------------------------- free

    /**
     * SGLang's {@code free(indices)}: frees the pages of the slots in {@code io[0, count)} as the
     * leases of the one who frees them: request {@code request} of {@code tenant} (SGLang's
     * request-level release), or, with {@code request} -1, the unattributed holds and, flagged
     * {@link #CACHE_EVICTION}, the prefix cache's (SGLang's tree evicting).
     *
     * @return how many pages were refused (double, stale, never allocated, page 0, another's)
     * @throws KvShieldException in strict mode, the first refusal; nothing released
     * @throws IllegalArgumentException for slots outside the pool, or more slots than the pool has; nothing released
     * @throws ForeignAccessException for a request of another tenant than {@code tenant}; nothing released
     */
    public int free(int count, int tenant, long request, int flags) {
        enter(flags);
        checkBound();
        if (count < 0 || count > slotCount) { // NOTE: more names than slots repeat one; the repeats' scratch holds slotCount
            throw new IllegalArgumentException("free count must be in [0, " + slotCount + "] (the pool's slots): " + count);
        }
        if (request < -1 || (request >= 0 && !pool.tenants().isRegistered(tenant))) {
            throw new IllegalArgumentException("a request's free needs its registered tenant: request=" + request + " tenant=" + tenant);
        }
        long holder = holderOf(request);
        long[] slots = slotScratch(count);
        io.get(0, slots, 0, count);
        int s = nextStamp();
        int n = 0;
        int repeated = 0;
        int shift = pageShift();
        // NOTE: one pass checks and dedups; a slot outside the pool throws having touched only scratch (pages, marks)
        for (int i = 0; i < count; i++) {
            long slot = slots[i];
            if (slot < 0 || slot >= slotCount) {
                throw new IllegalArgumentException("free of slot " + slot + " (index " + i + " of " + count
                        + "): outside the pool's slots [0, " + slotCount + ")");
            }
            int page = (int) (shift >= 0 ? slot >>> shift : slot / pageSizeTokens);
            if (mark[page] != s) {
                mark[page] = s;
                pages[n++] = page;
            } else if (pageSizeTokens == 1) {
                repeated++; // the same slot twice in one free: the second is a double free
                tenants[pageCount - repeated] = page;
            }
        }
        return request >= 0 ? freeAs(n, tenant, holder, repeated, flags) : freeAsEngine(n, repeated, flags);
    }

    /**
     * Frees {@code pages[0, n)} as {@code (tenant, holder)}'s owner leases (or its handoff
     * reservation's, before commit); pages it does not hold are refused.
     */
    private int freeAs(int n, int tenant, long holder, int repeated, int flags) {
        // NOTE: the usual free (every page the holder's, none listed twice, no free group) is looked up and released in one pool call
        boolean direct = (flags & IN_FREE_GROUP) == 0 && repeated == 0;
        boolean allHeld = direct ? pool.releaseHeldPages(tenant, holder, LeaseKind.OWNER, pages, 0, n, ReleaseReason.FINISHED, leases, 0)
                : view.leasesOf(pages, 0, n, tenant, holder, LeaseKind.OWNER, leases, 0) == n;
        int refused = 0;
        int held = n;
        if (!direct || !allHeld) {
            if (!allHeld) {
                for (int i = 0; i < n; i++) {
                    leases[i] = leases[i] != LeaseIds.NONE ? leases[i] : view.leaseOf(pages[i], tenant, holder, LeaseKind.RESERVATION);
                }
            }
            // NOTE: every page held as owner and none listed twice (a free group's): nothing to refuse or compact
            boolean clean = allHeld && repeated == 0;
            refused = clean ? 0 : refuse(n, tenant, holder, repeated);
            held = clean ? n : compact(n);
            if ((flags & IN_FREE_GROUP) != 0) {
                deferToGroup(tenant, holder, leases, held);
            } else {
                pool.release(tenant, holder, leases, 0, held, ReleaseReason.FINISHED);
            }
        }
        unlinkAll(held);
        return refused;
    }

    /**
     * SGLang's {@code free_group_end}: releases every page freed inside the group, one pool call per
     * (tenant, request).
     *
     * @return pages released
     */
    public int endFreeGroup(int flags) {
        enter(flags);
        int released = groupCount;
        for (int i = 0; i < groupCount; ) {
            int end = i + 1;
            while (end < groupCount && groupTenants[end] == groupTenants[i] && groupHolders[end] == groupHolders[i]) {
                end++;
            }
            pool.release(groupTenants[i], groupHolders[i], groupLeases, i, end - i, ReleaseReason.FINISHED);
            i = end;
        }
        groupCount = 0;
        return released;
    }

    /**
     * Turns {@code (tenant, holder)}'s holds {@code presented[0, n)} into deferred frees of the pending group,
     * held by the holder itself, or for the engine cache (a namespace) by {@link #CACHE_EVICTED_IN_GROUP}.
     */
    private void deferToGroup(int tenant, long holder, long[] presented, int n) {
        long deferredHolder = Owners.isNamespace(holder) ? CACHE_EVICTED_IN_GROUP : holder;
        pool.transfer(tenant, holder, presented, 0, n, LeaseKind.DEFERRED_FREE, deferredHolder, groupLeases, groupCount);
        java.util.Arrays.fill(groupTenants, groupCount, groupCount + n, tenant);
        java.util.Arrays.fill(groupHolders, groupCount, groupCount + n, deferredHolder);
        groupCount += n;
    }

    /** Pages freed inside the current free group, not yet released. */
    public int pendingGroupPages() {
        checkOpen();
        return groupCount;
    }

    /** Of {@link #pendingGroupPages}, those request {@code requestId} of {@code tenant} freed (what {@link #endRequestFrees} releases). */
    public int pendingRequestPages(long requestId, int tenant) {
        checkOpen();
        long holder = requestHolder(requestId);
        int n = 0;
        for (int i = 0; i < groupCount; i++) {
            n += groupHolders[i] == holder && groupTenants[i] == tenant ? 1 : 0;
        }
        return n;
    }

    /**
     * Releases the deferred frees request {@code requestId} made inside its release (every free in
     * a request's release is one, so {@link #adoptSlots} can still withdraw a free of a page the tree
     * cache then took); SGLang's own free group, when one is open, ends with {@link #endFreeGroup}
     * instead.
     *
     * @return pages released
     * @throws IllegalArgumentException for a request id no request has (negative included); nothing released
     */
    public int endRequestFrees(long requestId, int tenant, int flags) {
        enter(flags);
        long holder = requestHolder(requestId);
        int n = 0;
        int kept = 0;
        for (int i = 0; i < groupCount; i++) {
            if (groupHolders[i] == holder && groupTenants[i] == tenant) {
                moved[n++] = groupLeases[i];
            } else {
                groupLeases[kept] = groupLeases[i];
                groupTenants[kept] = groupTenants[i];
                groupHolders[kept++] = groupHolders[i];
            }
        }
        pool.release(tenant, holder, moved, 0, n, ReleaseReason.FINISHED);
        groupCount = kept;
        return n;
    }

    /**
     * A request's whole release in one crossing, when its only free was of the slots {@code io[0,
     * count)}: the same checks, refusals and outcome as {@code free(count, tenant, requestId, flags |
     * IN_FREE_GROUP)}, {@link #endRequestFrees} and (with {@code leftovers}) {@link
     * #releaseLeftovers} called in that order, without the deferred-free holds in between (nothing
     * can withdraw the free before the release ends). When the free throws (a strict-mode refusal,
     * a slot outside the pool) the request's earlier deferred frees are still released, nothing of
     * this free is, the leftovers stay, and the exception is rethrown: what that sequence leaves
     * when its free throws inside the release.
     *
     * <p>Implementation notes: when the request has earlier deferred frees (an earlier free of its
     * release already crossed), this free is deferred too, so {@link #endRequestFrees} releases them
     * all in call order in one pool call, as the sequence does (released first, this free's pages
     * would reach the quarantine and the audit trail ahead of the earlier ones).
     *
     * <p>{@code flags}' {@link #IN_FREE_GROUP} says whose the request's earlier deferred frees are. With it (every free of a
     * release carries it: the plug-in defers them all) they are this release's, released as above. Without it this call is
     * the release's only free, and deferred frees the request already has were made inside SGLang's free group, still
     * open: they stay deferred until {@link #endFreeGroup}, as upstream's group keeps them; this free and the leftovers are
     * released now.
     *
     * @return pages refused, as {@link #free} counts them
     * @throws IllegalArgumentException for a request id no request has (negative included); nothing changed
     */
    public int releaseRequest(int count, int tenant, long requestId, boolean leftovers, int flags) {
        checkOpen();
        requestHolder(requestId);
        if (!pool.tenants().isRegistered(tenant)) {
            throw new IllegalArgumentException("a request's release needs its registered tenant: request=" + requestId
                    + " tenant=" + tenant);
        }
        boolean endsFrees = (flags & IN_FREE_GROUP) != 0;
        int refused;
        try {
            int deferred = endsFrees && pendingRequestPages(requestId, tenant) > 0 ? IN_FREE_GROUP : 0;
            refused = free(count, tenant, requestId, (flags & ~IN_FREE_GROUP) | deferred);
        } catch (RuntimeException e) {
            if (endsFrees) {
                endRequestFrees(requestId, tenant, 0); // NOTE: the release still ends, as it does after a free that threw
            }
            throw e;
        }
        if (endsFrees) {
            endRequestFrees(requestId, tenant, 0);
        }
        if (leftovers && validHead(requestId) >= 0) { // NOTE: with nothing listed it releases nothing, its checks passed above
            releaseLeftovers(requestId, tenant, 0);
        }
        return refused;
    }

    /**
     * SGLang's tree cache kept request {@code requestId}'s slots {@code io[0, count)} (the part of an
     * insert's value it did not already hold; request -1: unattributed pages of {@code tenant},
     * for an insert outside any request's release): their pages become the cache's holds
     * ({@link #ENGINE_CACHE}), freed from then on only by its eviction. A page the request freed
     * earlier in the same release (still a deferred free) is taken back from that free, which was
     * stale: the tree references the page. A page neither the request nor the cache holds is refused:
     * counted, reported, nothing changes for it. Slots outside the pool throw before anything changes.
     *
     * @return refusals (frees withdrawn plus pages the request did not hold)
     * @throws KvShieldException in strict mode, the first refusal; nothing adopted
     */
    public int adoptSlots(int count, int tenant, long requestId, int flags) {
        enter(flags);
        checkBound();
        if (count < 0 || count > io.capacity() || requestId < -1 || !pool.tenants().isRegistered(tenant)) {
            throw new IllegalArgumentException("adopt of " + count + " slots of request " + requestId + " of tenant " + tenant
                    + " needs 0 <= count <= " + io.capacity() + ", a request (or -1) and its registered tenant");
        }
        long holder = holderOf(requestId);
        for (int i = 0; i < count; i++) {
            long slot = io.get(i);
            if (slot < 0 || slot >= slotCount) {
                throw new IllegalArgumentException("adopt of slot " + slot + " (index " + i + " of " + count
                        + "): outside the pool's slots [0, " + slotCount + ")");
            }
        }
        int s = nextStamp();
        int n = 0;
        for (int i = 0; i < count; i++) {
            int page = (int) (io.get(i) / pageSizeTokens);
            if (mark[page] != s && view.leaseOf(page, -1, ENGINE_CACHE, LeaseKind.NAMESPACE) == LeaseIds.NONE) {
                mark[page] = s; // NOTE: a page the cache holds already is an existing node's, not this request's
                pages[n++] = page;
            }
        }
        view.leasesOf(pages, 0, n, tenant, holder, LeaseKind.OWNER, leases, 0);
        int withdrawn = 0;
        RuntimeException first = null;
        for (int i = 0; i < n; i++) {
            if (leases[i] != LeaseIds.NONE) {
                continue;
            }
            leases[i] = view.leaseOf(pages[i], tenant, holder, LeaseKind.DEFERRED_FREE);
            RuntimeException e = leases[i] != LeaseIds.NONE
                    ? new KvShieldException("request " + requestId + " of tenant " + tenant + " freed page " + pages[i]
                            + " which its tree cache then kept: the free is withdrawn, the page stays the cache's")
                    : pool.refuseFree(pages[i], tenant, holder);
            withdrawn += leases[i] != LeaseIds.NONE ? 1 : 0;
            rejectedFrees++;
            lastRejection = e.getMessage();
            first = first == null ? e : first;
        }
        if (strict && first != null) {
            throw first;
        }
        int held = compact(n);
        if (withdrawn > 0) {
            dropFromGroup(leases, held);
        }
        pool.transfer(tenant, holder, leases, 0, held, LeaseKind.NAMESPACE, ENGINE_CACHE, moved, 0);
        unlinkAll(held);
        return n - held + withdrawn;
    }

    /** Removes the deferred frees among {@code withdrawn[0, n)} from the pending group. */
    private void dropFromGroup(long[] withdrawn, int n) {
        int kept = 0;
        for (int i = 0; i < groupCount; i++) {
            boolean drop = false;
            for (int j = 0; j < n && !drop; j++) {
                drop = groupLeases[i] == withdrawn[j];
            }
            if (!drop) {
                groupLeases[kept] = groupLeases[i];
                groupTenants[kept] = groupTenants[i];
                groupHolders[kept++] = groupHolders[i];
            }
        }
        groupCount = kept;
    }

    /**
     * Frees pages outside any request's release: as the prefix cache's holds while it evicts, else
     * (and for pages it does not hold) as unattributed ones, per tenant.
     */
    private int freeAsEngine(int n, int repeated, int flags) {
        boolean cacheEvicting = (flags & CACHE_EVICTION) != 0;
        if (cacheEvicting) {
            view.leasesOf(pages, 0, n, -1, ENGINE_CACHE, LeaseKind.NAMESPACE, leases, 0);
        } else {
            java.util.Arrays.fill(leases, 0, n, LeaseIds.NONE);
        }
        view.tenantsOf(pages, 0, n, tenants, 0);
        for (int i = 0; i < n; i++) {
            if (leases[i] == LeaseIds.NONE && tenants[i] >= 0) {
                leases[i] = view.leaseOf(pages[i], defaultTenant, UNATTRIBUTED, LeaseKind.OWNER);
                tenants[i] = leases[i] == LeaseIds.NONE ? tenants[i] : defaultTenant;
            }
        }
        int refused = refuse(n, -1, cacheEvicting ? ENGINE_CACHE : UNATTRIBUTED, repeated);
        int held = compact(n);
        releaseByHolder(held, (flags & IN_FREE_GROUP) != 0);
        return refused;
    }

    /**
     * Counts, reports and (in strict mode) throws the refusals among {@code pages[0, n)} (those with
     * no lease) and the {@code repeated} pages listed twice; releases nothing itself.
     */
    private int refuse(int n, int tenant, long holder, int repeated) {
        RuntimeException first = null;
        int refused = 0;
        for (int i = 0; i < n + repeated; i++) {
            boolean twice = i >= n;
            if (!twice && leases[i] != LeaseIds.NONE) {
                continue;
            }
            int page = twice ? tenants[pageCount - 1 - (i - n)] : pages[i];
            RuntimeException e = pool.refuseFree(page, tenant, holder);
            refused++;
            rejectedFrees++;
            lastRejection = e.getMessage();
            first = first == null ? e : first;
        }
        if (strict && first != null) {
            throw first;
        }
        return refused;
    }

    /** Moves the pages that have a lease (and their leases and tenants) to the front; returns how many. */
    private int compact(int n) {
        int held = 0;
        for (int i = 0; i < n; i++) {
            if (leases[i] != LeaseIds.NONE) {
                pages[held] = pages[i];
                tenants[held] = tenants[i];
                leases[held++] = leases[i];
            }
        }
        return held;
    }

    /** Releases {@code leases[0, held)} (tenants in {@code tenants}), one pool call per (tenant, holder). */
    private void releaseByHolder(int held, boolean inFreeGroup) {
        int s = nextStamp();
        for (int i = 0; i < held; i++) {
            if (mark[pages[i]] == s) {
                continue;
            }
            int tenant = tenants[i];
            long holder = view.holderOf(leases[i]);
            int n = 0;
            for (int j = i; j < held; j++) {
                if (mark[pages[j]] != s && tenants[j] == tenant && view.holderOf(leases[j]) == holder) {
                    mark[pages[j]] = s;
                    moved[n++] = leases[j];
                }
            }
            if (inFreeGroup) { // NOTE: SGLang's free group: held as deferred frees until endFreeGroup
                deferToGroup(tenant, holder, moved, n);
            } else {
                pool.release(tenant, holder, moved, 0, n, ReleaseReason.EVICTED);
            }
        }
    }

    /**
     * SGLang's {@code free_segment} inside a request's release: frees the pages of the request's
     * token positions {@code [startPos, startPos + count)} as its page list names them (a page
     * counts when its first slot is inside the segment, as in SGLang's stride over the segment),
     * without the slots SGLang holds on the device. Checked like {@link #free}.
     *
     * @return refused pages as {@link #free} counts them; or -1 when the request's list does not
     *     hold every page of the segment (nothing released): the caller frees by slots instead
     * @throws IllegalArgumentException for a request id no request has, or a segment outside the pool; nothing released
     */
    public int freeSegment(long requestId, long startPos, long count, int tenant, int flags) {
        enter(flags);
        checkBound();
        long holder = requestHolder(requestId);
        if (startPos < 0 || count < 0 || startPos > slotCount || count > slotCount - startPos) { // NOTE: no sum to overflow
            throw new IllegalArgumentException("free_segment of request " + requestId + " needs a segment inside the pool's "
                    + slotCount + " slots: start_pos=" + startPos + " count=" + count + " page_size=" + pageSizeTokens);
        }
        long lo = ceilDiv(startPos, pageSizeTokens);
        long hi = ceilDiv(startPos + count, pageSizeTokens);
        int n = 0;
        for (int p = validHead(requestId); p >= 0 && positionOfPage[p] >= lo; p = validNext(requestId, p)) {
            if (positionOfPage[p] < hi) {
                pages[n++] = p;
            }
        }
        if (n != hi - lo) {
            return -1;
        }
        reverse(n); // the list runs highest position first; SGLang frees a row segment in position order
        return n == 0 ? 0 : freeAs(n, tenant, holder, 0, flags);
    }

    /**
     * SGLang's prefix tree took a request's pages at positions {@code [fromPos, toPos)} ({@code
     * toPos} -1: every position from {@code fromPos}): their leases pass to the cache namespace,
     * and only a free outside a request's release can free them from now on.
     *
     * @return pages handed to the cache
     * @throws IllegalArgumentException for a request id no request has, or positions other than {@code 0 <= from <= to}
     *     or {@code to = -1}; nothing changed
     */
    public int adoptIntoCache(long requestId, int tenant, long fromPos, long toPos, int flags) {
        enter(flags);
        long holder = requestHolder(requestId);
        if (fromPos < 0 || toPos < -1 || (toPos >= 0 && toPos < fromPos)) {
            throw new IllegalArgumentException("adopt of request " + requestId + " needs 0 <= from <= to (or to = -1): from="
                    + fromPos + " to=" + toPos);
        }
        int n = 0;
        for (int p = validHead(requestId); p >= 0 && positionOfPage[p] >= fromPos; p = validNext(requestId, p)) {
            if (toPos < 0 || positionOfPage[p] < toPos) {
                pages[n++] = p;
            }
        }
        view.leasesOf(pages, 0, n, tenant, holder, LeaseKind.OWNER, leases, 0);
        int held = compact(n);
        pool.transfer(tenant, holder, leases, 0, held, LeaseKind.NAMESPACE, ENGINE_CACHE, moved, 0);
        unlinkAll(held);
        return held;
    }

    /**
     * Releases every page the request still holds as owner after its release (SGLang neither freed
     * them nor gave them to a prefix cache: without a cache that keeps pages, nothing else refers to
     * them any more).
     *
     * @return pages released (0 when SGLang freed everything itself)
     * @throws IllegalArgumentException for a request id no request has (negative included); nothing released
     */
    public int releaseLeftovers(long requestId, int tenant, int flags) {
        enter(flags);
        long holder = requestHolder(requestId);
        int n = 0;
        for (int p = validHead(requestId); p >= 0; p = validNext(requestId, p)) {
            pages[n++] = p;
        }
        view.leasesOf(pages, 0, n, tenant, holder, LeaseKind.OWNER, leases, 0);
        int held = compact(n);
        pool.release(tenant, holder, leases, 0, held, ReleaseReason.FINISHED);
        unlinkAll(held);
        return held;
    }

    private void reverse(int n) {
        for (int i = 0, j = n - 1; i < j; i++, j--) {
            int p = pages[i];
            pages[i] = pages[j];
            pages[j] = p;
        }
    }

    /** Pages the request still holds as owner (0 once its release freed them or handed them to the cache). */
    public int heldPages(long requestId) {
        checkOpen();
        requestHolder(requestId);
        int n = 0;
        for (int p = validHead(requestId); p >= 0; p = validNext(requestId, p)) {
            n++;
        }
        return n;
    }

    /**
     * Whether request {@code requestId} of {@code tenant} freed its page at page position {@code position} inside its
     * release (a deferred free its release has not ended yet).
     */
    public boolean freedInRelease(long requestId, int tenant, long position) {
        checkOpen();
        long holder = requestHolder(requestId);
        for (int i = 0; i < groupCount; i++) {
            if (groupHolders[i] == holder && groupTenants[i] == tenant && positionOfPage[view.pageOf(groupLeases[i])] == position) {
                return true;
            }
        }
        return false;
    }

    /** The page holding token position {@code position * pageSizeTokens} of {@code requestId}, or -1. */
    public int pageAt(long requestId, long position) {
        checkOpen();
        requestHolder(requestId);
        return listedPageAt(requestId, position);
    }

    private int listedPageAt(long requestId, long position) {
        for (int p = validHead(requestId); p >= 0 && positionOfPage[p] >= position; p = validNext(requestId, p)) {
            if (positionOfPage[p] == position) {
                return p;
            }
        }
        return -1;
    }

    /**
     * Lists pages a request holds through another path (a handoff reservation) at positions
     * {@code firstPosition, firstPosition + 1, ...}, so its release and {@link #freeSegment} find them.
     * Every page is checked before any is listed: inside the pool (page 0 excluded), named once, held
     * by the request (as owner, or through its reservation) and of the request's one tenant.
     *
     * @throws IllegalArgumentException for a request id no request has, a count or position out of
     *     range, a page outside the pool or named twice; ForeignAccessException for a page the request
     *     does not hold or of another tenant than its listed pages'. Nothing listed.
     */
    public void recordRequestPages(long requestId, int[] requestPages, int count, int firstPosition) {
        checkOpen();
        long holder = requestHolder(requestId);
        if (count < 0 || count > requestPages.length || firstPosition < 0 || firstPosition > Integer.MAX_VALUE - count) {
            throw new IllegalArgumentException("record of request " + requestId + "'s pages needs 0 <= count <= "
                    + requestPages.length + " and positions in int range: count=" + count + " first_position=" + firstPosition);
        }
        int s = nextStamp();
        for (int i = 0; i < count; i++) {
            int page = requestPages[i];
            if (page <= 0 || page >= pageCount || mark[page] == s) {
                throw new IllegalArgumentException("record of request " + requestId + "'s page " + page + " (entry " + i
                        + "): " + (page <= 0 || page >= pageCount ? "outside the pool's pages [1, " + pageCount + ")"
                        : "named twice") + "; nothing listed");
            }
            mark[page] = s;
        }
        int tenant = listTenant(requestId);
        for (int i = 0; i < count; i++) {
            int page = requestPages[i];
            int t = view.tenantOf(page);
            boolean held = t >= 0 && (view.leaseOf(page, t, holder, LeaseKind.OWNER) != LeaseIds.NONE
                    || view.leaseOf(page, t, holder, LeaseKind.RESERVATION) != LeaseIds.NONE);
            if (!held || (tenant >= 0 && t != tenant)) {
                throw new ForeignAccessException("record of request " + requestId + "'s page " + page + " (entry " + i + "): "
                        + (held ? "tenant " + t + "'s, the request's other pages are tenant " + tenant + "'s"
                        : "the request does not hold it (page tenant " + t + ")") + "; nothing listed");
            }
            tenant = t;
        }
        for (int i = 0; i < count; i++) {
            link(requestId, tenant, requestPages[i], firstPosition + i);
        }
    }

    /** Drops a page from whichever request's list holds it (the allocator saw it leave that request). */
    public void forgetPage(int page) {
        checkOpen();
        if (page < 0 || page >= pageCount) {
            throw new IllegalArgumentException("page " + page + " is outside the pool's pages [0, " + pageCount + ")");
        }
        unlink(page);
    }

    /** The request's highest-position page, or -1. */
    private int validHead(long requestId) {
        return listGet(requestId);
    }

    private int validNext(long requestId, int page) {
        return nextOfPage[page];
    }

    /** Puts {@code page} into the request's list at {@code position} (almost always at the head); a new list is {@code tenant}'s. */
    private void link(long requestId, int tenant, int page, int position) {
        unlink(page);
        positionOfPage[page] = position;
        listOfPage[page] = requestId;
        int head = listGet(requestId);
        if (head < 0 || positionOfPage[head] < position) {
            prevOfPage[page] = -1;
            nextOfPage[page] = head;
            if (head >= 0) {
                prevOfPage[head] = page;
            }
            listPut(requestId, page, tenant);
            return;
        }
        int at = head;
        while (nextOfPage[at] >= 0 && positionOfPage[nextOfPage[at]] > position) {
            at = nextOfPage[at];
        }
        int next = nextOfPage[at];
        prevOfPage[page] = at;
        nextOfPage[page] = next;
        nextOfPage[at] = page;
        if (next >= 0) {
            prevOfPage[next] = page;
        }
    }

    /**
     * Drops {@code pages[0, n)} from the lists that hold them, as {@link #unlink} of each in order would.
     *
     * <p>Implementation notes: a request's release frees its whole list in position order, lowest first; when the pages
     * are exactly one list from its tail to its head (each the one above the previous), the list goes at once, each
     * page's entry cleared without relinking its neighbours, which leave with it.
     */
    private void unlinkAll(int n) {
        if (n > 0 && isWholeListTailFirst(n)) {
            long requestId = listOfPage[pages[0]];
            for (int i = 0; i < n; i++) {
                listOfPage[pages[i]] = -1;
            }
            listRemove(requestId);
            return;
        }
        for (int i = 0; i < n; i++) {
            unlink(pages[i]);
        }
    }

    /** Whether {@code pages[0, n)} are one request's whole list, its tail first, each page the one above the previous. */
    private boolean isWholeListTailFirst(int n) {
        int tail = pages[0];
        if (listOfPage[tail] < 0 || nextOfPage[tail] >= 0) {
            return false;
        }
        for (int i = 0; i < n - 1; i++) {
            if (prevOfPage[pages[i]] != pages[i + 1]) {
                return false;
            }
        }
        return prevOfPage[pages[n - 1]] < 0;
    }

    /** Implementation notes: a head's unlinking (a lookup of its list) is out of line, so every page loop inlines this. */
    private void unlink(int page) {
        long requestId = listOfPage[page];
        if (requestId < 0) {
            return;
        }
        int prev = prevOfPage[page];
        int next = nextOfPage[page];
        if (prev >= 0) {
            nextOfPage[prev] = next;
        } else {
            headLeaves(requestId, next);
        }
        if (next >= 0) {
            prevOfPage[next] = prev;
        }
        listOfPage[page] = -1;
    }

    /** The request's head leaves its list: {@code next} is the new head, or (-1) the list is gone. */
    private void headLeaves(long requestId, int next) {
        if (next >= 0) {
            listSetHead(requestId, next);
        } else {
            listRemove(requestId);
        }
    }

    private int slotOf(long requestId) {
        return mix(requestId) & listMask;
    }

    private static int mix(long requestId) {
        long h = requestId * 0x9E3779B97F4A7C15L;
        return (int) (h ^ (h >>> 32));
    }

    private int listGet(long requestId) {
        for (int i = slotOf(requestId); listKeys[i] >= 0; i = (i + 1) & listMask) {
            if (listKeys[i] == requestId) {
                return listHeads[i];
            }
        }
        return -1;
    }

    /** The tenant of the request's list, or -1 when it has none. */
    private int listTenant(long requestId) {
        for (int i = slotOf(requestId); listKeys[i] >= 0; i = (i + 1) & listMask) {
            if (listKeys[i] == requestId) {
                return listTenants[i];
            }
        }
        return -1;
    }

    /** The new head of the request's existing list (its tenant stays). */
    private void listSetHead(long requestId, int head) {
        int i = slotOf(requestId);
        while (listKeys[i] != requestId) {
            i = (i + 1) & listMask;
        }
        listHeads[i] = head;
    }

    /** At most one entry per page-holding request, so the table (twice the pages) never fills. */
    private void listPut(long requestId, int head, int tenant) {
        int i = slotOf(requestId);
        while (listKeys[i] >= 0 && listKeys[i] != requestId) {
            i = (i + 1) & listMask;
        }
        listKeys[i] = requestId;
        listHeads[i] = head;
        listTenants[i] = tenant;
    }

    /** Linear-probing removal with backward shift, so lookups never stop at a hole. */
    private void listRemove(long requestId) {
        int i = slotOf(requestId);
        while (listKeys[i] != requestId) {
            if (listKeys[i] < 0) {
                return;
            }
            i = (i + 1) & listMask;
        }
        int hole = i;
        for (int j = (hole + 1) & listMask; listKeys[j] >= 0; j = (j + 1) & listMask) {
            int home = slotOf(listKeys[j]);
            if (((j - home) & listMask) >= ((j - hole) & listMask)) {
                listKeys[hole] = listKeys[j];
                listHeads[hole] = listHeads[j];
                listTenants[hole] = listTenants[j];
                hole = j;
            }
        }
        listKeys[hole] = -1;
    }

    /**
     * SGLang's {@code clear()}: releases every page a request, the prefix cache or the unattributed
     * holder holds through this allocator, then runs a step boundary. Holds of others (handoff
     * claims, a transfer's reservation) stay.
     */
    public void releaseAll() {
        checkOpen();
        endFreeGroup(0);
        for (int p = 0; p < pageCount; p++) {
            pages[p] = p;
        }
        view.tenantsOf(pages, 0, pageCount, tenants, 0);
        int n = 0;
        for (int p = 0; p < pageCount; p++) {
            long lease = tenants[p] < 0 ? LeaseIds.NONE
                    : listOfPage[p] >= 0 ? view.leaseOf(p, tenants[p], holderOf(listOfPage[p]), LeaseKind.OWNER)
                    : view.leaseOf(p, tenants[p], ENGINE_CACHE, LeaseKind.NAMESPACE);
            if (lease == LeaseIds.NONE && tenants[p] >= 0) {
                lease = view.leaseOf(p, tenants[p], UNATTRIBUTED, LeaseKind.OWNER);
            }
            if (lease != LeaseIds.NONE) {
                pages[n] = p;
                tenants[n] = tenants[p];
                leases[n++] = lease;
            }
        }
        releaseByHolder(n, false);
        for (int i = 0; i < n; i++) {
            unlink(pages[i]);
        }
        pool.endStep();
    }

    private int nextStamp() {
        if (++stamp == Integer.MAX_VALUE) {
            java.util.Arrays.fill(mark, 0);
            stamp = 1;
        }
        return stamp;
    }

    // ---------------------------------------------------------------- steps and state

    /** The step boundary, once per scheduler step (or {@link #STEP_BOUNDARY} on the step's first call). */
    public int endStep() {
        checkOpen();
        return pool.endStep();
    }

    /**
     * Every batch call's entry: refuses a closed allocator, then runs the step boundary {@code flags} asks for. The boundary
     * is the step's (the caller consumed its flag with this crossing), so it runs even when the call's own arguments are
     * then refused; those refusals change nothing else.
     */
    private void enter(int flags) {
        checkOpen();
        if ((flags & STEP_BOUNDARY) != 0) {
            pool.endStep();
        }
    }

    /** Refuses every call on a closed allocator (its pool and memory are gone). */
    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException(name + " is closed");
        }
    }

    private void checkBound() {
        checkOpen();
        if (io == null) {
            throw new IllegalStateException("bind(io, plan) was not called");
        }
    }

    /** SGLang's {@code available_size()}: token slots {@code alloc} can hand out now. */
    public long availableTokens() {
        checkOpen();
        return pool.availableTokens();
    }

    /** Whole pages {@code alloc} can hand out now. */
    public int availablePages() {
        checkOpen();
        return pool.available();
    }

    /**
     * The pages (page 0 excluded) whose life-cycle state is in {@code stateMask} (bit {@code 1 << ordinal} of
     * {@link dev.kvshield.lifecycle.PageState}), ascending, written to {@code out}; for SGLang's
     * {@code free_pages}/{@code release_pages} views and checks. Reads only; O(pages).
     *
     * @return how many were written
     */
    public int pagesIn(int stateMask, int[] out) {
        checkOpen();
        int n = 0;
        for (int p = 1; p < pageCount; p++) {
            if ((stateMask >>> view.stateOf(p).ordinal() & 1) != 0) {
                out[n++] = p;
            }
        }
        return n;
    }

    /** The tenant holding {@code page} (the pool's answer), or -1. */
    public int tenantOf(int page) {
        checkOpen();
        return page < 0 || page >= pageCount ? -1 : view.tenantOf(page);
    }

    /** The request whose list holds {@code page} as owner, or -1 (not a request's, or a cache or unattributed page). */
    public long requestOf(int page) {
        checkOpen();
        return page < 0 || page >= pageCount ? -1 : listOfPage[page];
    }

    public long rejectedFrees() {
        return rejectedFrees;
    }

    public long unattributedPages() {
        return unattributedPages;
    }

    /** Allocations whose plan rows did not add up to the pages asked for (attributed to the default tenant). */
    public long planMismatches() {
        return planMismatches;
    }

    /** The pool's message for the last refused free, or empty. */
    public String lastRejection() {
        return lastRejection;
    }

    /** Admission limits: what the pool admits and what the engine advertises. */
    public AdmissionLimits admission() {
        checkOpen();
        return pool.admission();
    }

    public boolean strict() {
        return strict;
    }

    public KvPagePool pool() {
        return pool;
    }

    public int pageSizeTokens() {
        return pageSizeTokens;
    }

    public int pageCount() {
        return pageCount;
    }

    /** The loopback port metrics are served on, or -1 when {@code metricsBasePort} is off. */
    public int metricsPort() {
        return metricsEndpoint == null ? -1 : metricsEndpoint.port();
    }

    private PrometheusEndpoint startMetrics(PrometheusMeterRegistry registry, BridgeSettings settings) {
        try {
            return PrometheusEndpoint.startLoopback(registry, settings.metricsBasePort, settings.rank);
        } catch (java.io.IOException e) {
            throw new IllegalStateException("cannot serve metrics on loopback port " + (settings.metricsBasePort + settings.rank) + ": "
                    + e.getMessage(), e);
        }
    }

    /**
     * Stops the metrics endpoint and the pool's protection worker; closes the memory if {@link #open} built it. From then on
     * every call that reads or changes the pool or the page lists throws {@link IllegalStateException}; closing again does
     * nothing.
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        if (metricsEndpoint != null) {
            metricsEndpoint.close();
        }
        try {
            pool.close();
        } finally {
            if (auditTrail != null) {
                auditTrail.close(); // NOTE: after the pool, so the trail's last signed checkpoint covers its final events
            }
            unlock(auditLock);
            if (ownsMemory) {
                memory.close();
            }
        }
    }

    /**
     * Records that request {@code requestId} of {@code tenant} ended, in the pool's audit trail when one is attached (its
     * summary is written at the next step boundary; until then the trail keeps what the request read): call once, after
     * the request's last release. {@code label} is the engine's own name for the request (SGLang's {@code rid}), so an
     * operator can find the request a trail names. Does nothing without a trail.
     *
     * @throws IllegalArgumentException naming the value: a request id out of range, an unknown tenant, a label the trail
     *     refuses
     */
    public void requestFinished(int tenant, long requestId, boolean aborted, String label) {
        checkOpen();
        requestHolder(requestId);
        if (auditTrail != null) {
            auditTrail.requestFinished(tenant, requestId, aborted ? RequestOutcome.ABORTED : RequestOutcome.COMPLETED, label);
        }
    }

    /** The pool's signed audit trail, or null when none was configured. */
    public AuditTrail auditTrail() {
        return auditTrail;
    }

    // ---------------------------------------------------------------- hot-path helpers

    /** Each plan row's written slots of its last new page (the batch's row scratch, sized by {@link #growRowScratch}). */
    private int[] rowLastWritten = new int[0];
    /** Each plan row's {@code last_loc}, the plan's or derived ({@link #lastLocs}). */
    private long[] rowLastLoc = new long[0];
    /** Each plan row's lease on the partial page it extends. */
    private long[] rowPartial = new long[0];
    /** Open-addressing set of the plan's request ids (-1: empty), to refuse a request named by two rows. */
    private long[] rowSeen = new long[0];
    /** Slot values staged for one bulk copy into or out of {@code io}; grown once to the buffer's size. */
    private long[] slotScratch = new long[0];

    /** log2 of the page size when it is a power of two (a slot's page is then a shift, not a division), else -1. */
    private int pageShift() {
        return Integer.bitCount(pageSizeTokens) == 1 ? Integer.numberOfTrailingZeros(pageSizeTokens) : -1;
    }

    /** A scratch of at least {@code n} slots (the first call sizes it for any batch the io buffer can carry). */
    private long[] slotScratch(int n) {
        if (slotScratch.length < n) {
            slotScratch = new long[Math.max(n, io.capacity())];
        }
        return slotScratch;
    }

    /**
     * Allocates every row's new pages into {@code leases} in row order, all rows or none (one pool
     * call that also records each row's pages as written up to its sequence), and links them into
     * their requests' page lists.
     */
    private boolean allocatePlannedRows(int planRows) {
        int total = 0;
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long seq = plan.get(o + 3);
            int n = (int) newPages(plan.get(o + 2), seq);
            rowTenants[r] = (int) plan.get(o + 1);
            rowHolders[r] = holderOf(plan.get(o));
            rowCounts[r] = n;
            rowLastWritten[r] = n == 0 ? 0 : (int) (seq - (ceilDiv(plan.get(o + 2), pageSizeTokens) + n - 1) * pageSizeTokens);
            total += n;
        }
        if (!pool.allocateRowsWritten(planRows, rowTenants, rowHolders, rowCounts, rowLastWritten, LeaseKind.OWNER, leases, 0)) {
            return false;
        }
        decodePages(total);
        int h = 0;
        for (int r = 0; r < planRows; r++) {
            int n = rowCounts[r];
            if (n == 0) {
                continue;
            }
            if (rowHolders[r] == UNATTRIBUTED) {
                unattributedPages += n;
            } else {
                int o = r * PLAN_ROW;
                linkRun(plan.get(o), rowTenants[r], h, n, ceilDiv(plan.get(o + 2), pageSizeTokens));
            }
            h += n;
        }
        return true;
    }

    /** {@code need} whole pages for the default tenant's {@link #UNATTRIBUTED} holder, recorded as written, into {@code leases}. */
    private boolean allocateUnattributed(int need) {
        rowTenants[0] = defaultTenant;
        rowHolders[0] = UNATTRIBUTED;
        rowCounts[0] = need;
        rowLastWritten[0] = pageSizeTokens;
        if (!pool.allocateRowsWritten(1, rowTenants, rowHolders, rowCounts, rowLastWritten, LeaseKind.OWNER, leases, 0)) {
            return false;
        }
        decodePages(need);
        return true;
    }

    /**
     * The pages of the leases just minted, {@code leases[0, n)}, into {@code pages[0, n)}: decoded once for
     * the page lists and the slots out (the pool minted them now, so each is well formed).
     */
    private void decodePages(int n) {
        LeaseIds ids = view.leaseIds();
        for (int i = 0; i < n; i++) {
            pages[i] = ids.page(leases[i]);
        }
    }

    /**
     * Links the pages {@code pages[from, from + n)} (of {@code leases[from, from + n)}) into the request's list at positions {@code
     * firstPosition, firstPosition + 1, ...}, as {@link #link} page by page would: above the list's
     * head (an extension, the usual case) in one pass with one lookup of the list, else page by page.
     */
    private void linkRun(long requestId, int tenant, int from, int n, long firstPosition) {
        for (int i = 0; i < n; i++) {
            unlink(pages[from + i]); // NOTE: first, as link does: a stale entry of this request moves its head
        }
        int head = listGet(requestId);
        if (head >= 0 && positionOfPage[head] >= firstPosition) {
            for (int i = 0; i < n; i++) {
                link(requestId, tenant, pages[from + i], (int) (firstPosition + i));
            }
            return;
        }
        // NOTE: each page's links written once: below it the run's previous page (the old head for the first), above it the next
        int last = from + n - 1;
        for (int i = from; i <= last; i++) {
            int page = pages[i];
            positionOfPage[page] = (int) (firstPosition + i - from);
            listOfPage[page] = requestId;
            nextOfPage[page] = i == from ? head : pages[i - 1];
            prevOfPage[page] = i == last ? -1 : pages[i + 1];
        }
        if (head >= 0) {
            prevOfPage[head] = pages[from];
        }
        listPut(requestId, pages[last], tenant);
    }
}
