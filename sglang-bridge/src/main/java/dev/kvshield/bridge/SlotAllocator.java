package dev.kvshield.bridge;

import dev.kvshield.KvShieldException;
import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.bridge.memory.EngineBuffers;
import dev.kvshield.bridge.memory.ExternalMemoryProvider;
import dev.kvshield.bridge.memory.PageMemoryProvider;
import dev.kvshield.bridge.memory.PageMemoryProviders;
import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PrometheusEndpoint;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * SGLang's KV allocator contract on a {@link KvPagePool}: token slots in, token slots out, through
 * two shared direct buffers the Python side binds once ({@link #bind}).
 *
 * <ul>
 *   <li>A token slot is {@code page * pageSizeTokens + offset}; page 0 is reserved (SGLang writes
 *       padded tokens' dummy outputs there) and never handed out.
 *   <li>The {@code io} buffer carries slots: allocations write them from index 0, {@link #free}
 *       reads them from index 0.
 *   <li>The {@code plan} buffer carries the step's host-side plan, {@value #PLAN_ROW} longs per
 *       request: request id (-1: unknown, owner {@link #UNATTRIBUTED}), tenant id, prefix length, sequence length, slot of the prefix's last
 *       token (-1: not known host-side; derived from the request's page list). Pages are attributed to each row's request and tenant, and each row's
 *       {@code [prefix, seq)} is recorded as written (the allocator never sees KV writes).
 *   <li>Per request, the pages it allocated are kept in position order (page {@code k} holds its
 *       tokens {@code [k * pageSizeTokens, (k + 1) * pageSizeTokens)}), so an extension finds the
 *       prefix's partial page and {@link #freeSegment} finds a row segment's pages host-side: page
 *       ids never need to come back from the device.
 *   <li>Every batch call takes {@code flags}; {@link #STEP_BOUNDARY} runs the pool's step boundary
 *       first, so a scheduler step costs one crossing.
 *   <li>Frees carry no generations: the allocator keeps each page's current handle and owner
 *       ({@code handleByPage}) and releases through them. A free of a slot whose page is not owned
 *       now (double, stale, never allocated, page 0) or is owned by another tenant than the
 *       releasing request's is handed to the pool with the last handle the page had, so the pool
 *       classifies it, counts it and emits its rejection event; in production mode it is then
 *       dropped and the rest of the batch released, in strict mode the pool's exception is thrown
 *       and nothing is released. Out-of-range slots are always an exception, nothing released.
 * </ul>
 *
 * <p>Called from one scheduler thread; not thread-safe. Allocation and free do not allocate Java
 * objects except on rejections.
 *
 * <p>Implementation notes: the pool's own lock makes each pool call atomic; the page table here
 * mirrors the pool's owned pages exactly (every change goes through a pool call that succeeded
 * first). Allocations check {@link KvPagePool#available()} before reserving, so "none" leaves
 * both unchanged; only a tenant quota hit halfway through a batch rolls reserved pages back
 * (released with reason {@code REJECTED}).
 */
public final class SlotAllocator implements AutoCloseable {
    /** Flag: run the pool's step boundary before the call. */
    public static final int STEP_BOUNDARY = 1;
    /** Longs per plan row. */
    public static final int PLAN_ROW = 5;
    /** Owner of pages allocated with no plan row (counted in {@link #unattributedPages()}). */
    public static final long UNATTRIBUTED = Owners.namespace(0);
    /** Bytes per audit file before the trail rotates to the next one. */
    private static final long AUDIT_FILE_BYTES = 256L << 20;
    /** Owner of the pages kvshield's prefix cache holds: only the cache releases them, never a bare slot free. */
    public static final long PREFIX_CACHE = Owners.namespace(1);

    private final KvPagePool pool;
    private final PageMemory memory;
    private final boolean ownsMemory;
    private final boolean strict;
    private final int pageSizeTokens;
    private final int pageCount;
    private final long slotCount;
    private final int defaultTenant;

    // Page table: the current handle and owner while owned, the last ones after release.
    private final long[] handleByPage;
    private final int[] tenantByPage;
    private final long[] ownerByPage;
    private final boolean[] owned;

    // Scratch, so batch calls do not allocate.
    private final long[] handles;
    private final int[] pages;
    private final int[] mark;
    private int stamp;
    private final long[] single = new long[2];

    // Per-request page lists: doubly linked through the pages, highest position first; the head of
    // each request's list in an open-addressing map (linear probing) keyed by request id. Pages that
    // left their request another way (the prefix cache, a handoff) are dropped lazily on the next walk.
    private final int[] nextOfPage;
    private final int[] prevOfPage;
    private final int[] positionOfPage;
    private final long[] listOfPage;
    private final long[] listKeys;
    private final int[] listHeads;
    private final int listMask;

    private LongBuffer io;
    private LongBuffer plan;
    private long rejectedFrees;
    private long unattributedPages;
    private long planMismatches;
    private String lastRejection = "";
    private final PrometheusEndpoint metricsEndpoint;
    private final AuditTrail auditTrail;

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
        this.auditTrail = settings.auditDir == null ? null : attachAudit(pool, settings);
        this.metricsEndpoint = prometheus == null ? null : startMetrics(prometheus, settings);
        this.memory = memory;
        this.ownsMemory = ownsMemory;
        this.strict = settings.strict;
        this.pageSizeTokens = geometry.pageSizeTokens();
        this.pageCount = geometry.pageCount();
        this.slotCount = (long) pageCount * pageSizeTokens;
        this.defaultTenant = pool.tenants().register(settings.defaultTenant);
        handleByPage = new long[pageCount];
        for (int p = 0; p < pageCount; p++) {
            handleByPage[p] = PageHandles.encode(p, pool.generationOf(p));
        }
        tenantByPage = new int[pageCount];
        java.util.Arrays.fill(tenantByPage, -1);
        ownerByPage = new long[pageCount];
        java.util.Arrays.fill(ownerByPage, Owners.NOBODY);
        owned = new boolean[pageCount];
        handles = new long[pageCount];
        pages = new int[pageCount];
        mark = new int[pageCount];
        nextOfPage = new int[pageCount];
        prevOfPage = new int[pageCount];
        positionOfPage = new int[pageCount];
        listOfPage = new long[pageCount];
        java.util.Arrays.fill(listOfPage, -1);
        int capacity = Integer.highestOneBit(Math.max(16, pageCount) * 2 - 1) * 2;
        listKeys = new long[capacity];
        java.util.Arrays.fill(listKeys, -1);
        listHeads = new int[capacity];
        listMask = capacity - 1;
    }

    /**
     * The pool's signed audit trail: rotating files {@code audit-<poolId>-r<rank>} in the audit directory,
     * checkpoints signed with the configured key. Closes the pool and fails naming the setting if either
     * cannot be used (a compliance pool never runs without its trail).
     */
    private static AuditTrail attachAudit(KvPagePool pool, BridgeSettings settings) {
        try {
            AuditKeys.SigningKey key = AuditKeys.loadSigningKey(settings.auditSigningKey);
            AuditSink sink = AuditSink.rotatingFiles(settings.auditDir, "audit-" + settings.poolId + "-r" + settings.rank,
                    AUDIT_FILE_BYTES);
            return AuditTrail.attach(pool, AuditConfig.builder().sink(sink).signingKey(key).build());
        } catch (IOException e) {
            pool.close();
            throw new IllegalArgumentException(BridgeSettings.AUDIT_SIGNING_KEY + "/" + BridgeSettings.AUDIT_DIR
                    + " cannot be used: " + e.getMessage());
        }
    }

    /**
     * Opens an allocator over the engine's KV buffers.
     *
     * @param settings see {@link BridgeSettings}
     * @param pageSizeTokens SGLang's page size (1 for the token allocator)
     * @param pageCount pages per buffer, page 0 included ({@code size / pageSize + 1})
     * @param layers layers across every registered KV cache (target and draft)
     * @param kinds buffer kinds of one layer ({@code K, V} or {@code LATENT})
     * @param bytesPerToken bytes per token of each kind
     * @param addresses data pointer of each buffer, in global order {@code layer * kinds + kind}
     * @param byteSizes bytes of each buffer
     * @param deviceIndex the buffers' device ordinal, -1 for host memory
     * @param streamHandle the engine's CUDA stream (0: legacy default stream; ignored for host memory)
     * @param eventHandles one CUDA event per further engine stream, re-recorded at each forward
     *     launch (empty for host memory); protection work waits on them
     */
    public static SlotAllocator open(Map<String, String> settings, int pageSizeTokens, int pageCount, int layers, String[] kinds,
            int[] bytesPerToken, long[] addresses, long[] byteSizes, int deviceIndex, long streamHandle, long[] eventHandles) {
        BridgeSettings s = BridgeSettings.parse(settings);
        List<BufferKind> k = new ArrayList<>();
        for (String kind : kinds) {
            k.add(BufferKind.valueOf(kind));
        }
        PoolGeometry geometry = PoolGeometry.builder().layers(layers).pageSizeTokens(pageSizeTokens).pageCount(pageCount)
                .buffers(k, bytesPerToken).build();
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
        // NOTE: a tenant registered on the pool with its own policy (a quota, a level) keeps it
        try {
            return pool.tenants().idOf(name);
        } catch (dev.kvshield.tenant.UnknownTenantException e) {
            return pool.tenants().register(name);
        }
    }

    /** The name of a registered tenant id. */
    public String tenantName(int tenant) {
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
     * @return {@code slots}, or -1 when the pool cannot give them (nothing changed)
     */
    public long alloc(long slots, int planRows, int flags) {
        boundary(flags);
        checkBound();
        if (slots <= 0 || slots % pageSizeTokens != 0 || slots > slotCount) {
            throw new IllegalArgumentException("alloc needs a positive multiple of the page size " + pageSizeTokens
                    + " up to " + slotCount + " slots: need_size=" + slots);
        }
        int need = (int) (slots / pageSizeTokens);
        checkPlan(planRows);
        long planned = 0;
        for (int r = 0; r < planRows; r++) {
            planned += newPages(plan.get(r * PLAN_ROW + 2), plan.get(r * PLAN_ROW + 3));
        }
        boolean attributed = planRows > 0 && planned == need;
        if (planRows > 0 && !attributed) {
            planMismatches++;
        }
        if (pool.available() < need) {
            return -1;
        }
        if (attributed) {
            if (!allocateRows(planRows)) {
                return -1;
            }
        } else {
            if (!pool.allocate(defaultTenant, UNATTRIBUTED, need, handles, 0)) {
                return -1;
            }
            record(defaultTenant, UNATTRIBUTED, 0, need);
            unattributedPages += need;
        }
        int out = 0;
        for (int i = 0; i < need; i++) {
            long base = (long) PageHandles.page(handles[i]) * pageSizeTokens;
            for (int k = 0; k < pageSizeTokens; k++) {
                io.put(out++, base + k);
            }
        }
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
     *     the caller passes it explicitly. Nothing changed in either case.
     * @throws IllegalArgumentException for a plan that does not add up, or a partial page that is
     *     not owned; ForeignAccessException for a partial page of another tenant
     */
    public long allocExtend(int planRows, long extendTokens, int flags) {
        boundary(flags);
        checkBound();
        checkPlan(planRows);
        if (!deriveLastLocs(planRows)) {
            return -2;
        }
        if (extendTokens < 0 || extendTokens > slotCount) {
            throw new IllegalArgumentException("extend_num_tokens must be in [0, " + slotCount + "]: " + extendTokens);
        }
        long tokens = 0;
        long need = 0;
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            tokens += seq - prefix;
            need += newPages(prefix, seq);
            if (partialFill(prefix, seq) > 0) {
                checkPartialPage(r, plan.get(o + 4), prefix, (int) plan.get(o + 1));
            }
        }
        if (tokens != extendTokens) {
            throw new IllegalArgumentException("plan rows extend " + tokens + " tokens but extend_num_tokens=" + extendTokens);
        }
        if (pool.available() < need) {
            return -1;
        }
        if (!allocateRows(planRows)) {
            return -1;
        }
        int out = 0;
        int h = 0;
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            long lastLoc = plan.get(o + 4);
            int fill = partialFill(prefix, seq);
            if (fill > 0) {
                int page = (int) (lastLoc / pageSizeTokens);
                int from = (int) (prefix % pageSizeTokens);
                pool.markWritten(tenantByPage[page], ownerByPage[page], handleByPage[page], from, from + fill);
                for (int k = 1; k <= fill; k++) {
                    io.put(out++, lastLoc + k);
                }
            }
            long pos = prefix + fill;
            while (pos < seq) {
                long base = (long) PageHandles.page(handles[h++]) * pageSizeTokens;
                long n = Math.min(pageSizeTokens, seq - pos);
                for (int k = 0; k < n; k++) {
                    io.put(out++, base + k);
                }
                pos += n;
            }
        }
        return extendTokens;
    }

    /** Fills in every row's {@code last_loc} of -1 that a partial page needs; false if one is not known here. */
    private boolean deriveLastLocs(int planRows) {
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long prefix = plan.get(o + 2);
            if (plan.get(o + 4) >= 0 || partialFill(prefix, plan.get(o + 3)) == 0) {
                continue;
            }
            int page = plan.get(o) < 0 ? -1 : pageAt(plan.get(o), (prefix - 1) / pageSizeTokens);
            if (page < 0) {
                return false;
            }
            plan.put(o + 4, (long) page * pageSizeTokens + (prefix - 1) % pageSizeTokens);
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

    private void checkPartialPage(int row, long lastLoc, long prefix, int tenant) {
        if (lastLoc < 0 || lastLoc >= slotCount || (lastLoc + 1) % pageSizeTokens != prefix % pageSizeTokens) {
            throw new IllegalArgumentException("plan row " + row + ": last_loc=" + lastLoc + " does not end a prefix of " + prefix
                    + " tokens in pages of " + pageSizeTokens + " slots (pool has " + slotCount + " slots)");
        }
        int page = (int) (lastLoc / pageSizeTokens);
        if (page == 0 || !owned[page]) {
            throw new IllegalArgumentException("plan row " + row + ": last_loc=" + lastLoc + " is on page " + page
                    + ", which no request owns now; the extension would write into a page it does not hold");
        }
        if (tenantByPage[page] != tenant) {
            throw new ForeignAccessException("plan row " + row + " of tenant " + tenant + " would extend page " + page
                    + " owned by tenant " + tenantByPage[page] + " " + Owners.describe(ownerByPage[page]));
        }
    }

    private void checkPlan(int planRows) {
        if (planRows < 0 || (long) planRows * PLAN_ROW > plan.capacity()) {
            throw new IllegalArgumentException("plan rows must be in [0, " + plan.capacity() / PLAN_ROW + "]: " + planRows);
        }
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            long id = plan.get(o);
            long tenant = plan.get(o + 1);
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            if (id < -1 || tenant < 0 || tenant > Integer.MAX_VALUE || !pool.tenants().isRegistered((int) tenant) || prefix < 0
                    || seq < prefix || seq > slotCount) {
                throw new IllegalArgumentException("plan row " + r + " is invalid: request=" + id + " tenant=" + tenant + " prefix="
                        + prefix + " seq=" + seq + " (request >= 0 or -1 for unattributed, a registered tenant, 0 <= prefix <= seq <= " + slotCount + ")");
            }
        }
    }

    /** Allocates every row's new pages into {@code handles} in row order; all or nothing. */
    private boolean allocateRows(int planRows) {
        int h = 0;
        for (int r = 0; r < planRows; r++) {
            int o = r * PLAN_ROW;
            int tenant = (int) plan.get(o + 1);
            long owner = ownerOf(plan.get(o));
            long prefix = plan.get(o + 2);
            long seq = plan.get(o + 3);
            int n = (int) newPages(prefix, seq);
            if (owner == UNATTRIBUTED) {
                unattributedPages += n;
            }
            if (!pool.allocate(tenant, owner, n, handles, h)) {
                rollBack(r, h);
                return false;
            }
            record(tenant, owner, h, n);
            long pos = ceilDiv(prefix, pageSizeTokens) * pageSizeTokens;
            for (int i = h; i < h + n; i++) {
                int to = (int) Math.min(pageSizeTokens, seq - pos);
                pool.markWritten(tenant, owner, handles[i], 0, to);
                if (owner != UNATTRIBUTED) {
                    link(plan.get(o), PageHandles.page(handles[i]), (int) (pos / pageSizeTokens));
                }
                pos += to;
            }
            h += n;
        }
        return true;
    }

    private void rollBack(int rows, int allocated) {
        int h = 0;
        for (int r = 0; r < rows; r++) {
            int o = r * PLAN_ROW;
            int n = (int) newPages(plan.get(o + 2), plan.get(o + 3));
            pool.release((int) plan.get(o + 1), ownerOf(plan.get(o)), handles, h, n, ReleaseReason.REJECTED);
            for (int i = h; i < h + n; i++) {
                owned[PageHandles.page(handles[i])] = false;
                unlink(PageHandles.page(handles[i]));
            }
            h += n;
        }
    }

    private static long ownerOf(long requestId) {
        return requestId < 0 ? UNATTRIBUTED : Owners.request(requestId);
    }

    private void record(int tenant, long owner, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            int page = PageHandles.page(handles[i]);
            handleByPage[page] = handles[i];
            tenantByPage[page] = tenant;
            ownerByPage[page] = owner;
            owned[page] = true;
        }
    }

    // ---------------------------------------------------------------- free

    /**
     * SGLang's {@code free(indices)}: releases the pages of the slots in {@code io[0, count)}.
     *
     * @param releasingTenant the tenant of the request whose pages these are (SGLang's request-level
     *     release), or -1 when the caller does not know (prefix-cache eviction)
     * @return how many pages were rejected (double, stale, never allocated, page 0, other tenant's)
     * @throws KvShieldException in strict mode, the pool's rejection of the first bad page; nothing released
     * @throws IllegalArgumentException for slots outside the pool; nothing released
     */
    public int free(int count, int releasingTenant, int flags) {
        boundary(flags);
        checkBound();
        if (count < 0 || count > io.capacity()) {
            throw new IllegalArgumentException("free count must be in [0, " + io.capacity() + "]: " + count);
        }
        if (releasingTenant < -1 || (releasingTenant >= 0 && !pool.tenants().isRegistered(releasingTenant))) {
            throw new IllegalArgumentException("releasing tenant " + releasingTenant + " is not registered");
        }
        for (int i = 0; i < count; i++) {
            long slot = io.get(i);
            if (slot < 0 || slot >= slotCount) {
                throw new IllegalArgumentException("free of slot " + slot + " (index " + i + " of " + count
                        + "): outside the pool's slots [0, " + slotCount + ")");
            }
        }
        int s = nextStamp();
        int valid = 0;
        int rejected = 0;
        for (int i = 0; i < count; i++) {
            int page = (int) (io.get(i) / pageSizeTokens);
            boolean repeat = mark[page] == s;
            if (repeat && pageSizeTokens > 1) {
                continue; // several slots of one page: SGLang frees the page once
            }
            boolean ok = !repeat && page != 0 && owned[page] && ownerByPage[page] != PREFIX_CACHE
                    && (releasingTenant < 0 || tenantByPage[page] == releasingTenant);
            mark[page] = s;
            if (ok) {
                pages[valid++] = page;
                continue;
            }
            RuntimeException e = poolRejection(page, releasingTenant, repeat);
            rejectedFrees++;
            rejected++;
            lastRejection = e.getMessage();
            if (strict) {
                throw e;
            }
        }
        releaseGrouped(valid, releasingTenant >= 0 ? ReleaseReason.FINISHED : ReleaseReason.EVICTED);
        return rejected;
    }

    /** Has the pool classify, count and audit a bad free; returns its exception. */
    private RuntimeException poolRejection(int page, int releasingTenant, boolean repeat) {
        int tenant = releasingTenant >= 0 ? releasingTenant : tenantByPage[page] >= 0 ? tenantByPage[page] : defaultTenant;
        // NOTE: a bare free names no owner; the cache's pages are refused as that owner's (the pool counts and audits it).
        long owner = ownerByPage[page] >= 0 && ownerByPage[page] != PREFIX_CACHE ? ownerByPage[page] : UNATTRIBUTED;
        single[0] = handleByPage[page];
        single[1] = handleByPage[page];
        try {
            pool.release(tenant, owner, single, 0, repeat ? 2 : 1, ReleaseReason.FINISHED);
        } catch (KvShieldException e) {
            return e;
        }
        throw new IllegalStateException("bridge page table and pool disagree: page " + page + " was released by a free the bridge"
                + " rejected (owned=" + owned[page] + ", tenant " + tenantByPage[page] + ")");
    }

    /** Releases {@code pages[0, count)}, one pool call per (tenant, owner). */
    private void releaseGrouped(int count, ReleaseReason reason) {
        int s = nextStamp();
        for (int i = 0; i < count; i++) {
            int first = pages[i];
            if (mark[first] == s) {
                continue;
            }
            int tenant = tenantByPage[first];
            long owner = ownerByPage[first];
            int n = 0;
            for (int j = i; j < count; j++) {
                int p = pages[j];
                if (mark[p] != s && tenantByPage[p] == tenant && ownerByPage[p] == owner) {
                    mark[p] = s;
                    handles[n++] = handleByPage[p];
                }
            }
            pool.release(tenant, owner, handles, 0, n, reason);
            // handleByPage keeps the released handle: a repeated free of it is a double free.
            for (int k = 0; k < n; k++) {
                owned[PageHandles.page(handles[k])] = false;
                unlink(PageHandles.page(handles[k]));
            }
        }
    }

    /**
     * SGLang's {@code free_segment} inside a request's release: frees the pages of the request's
     * token positions {@code [startPos, startPos + count)} as its page list names them (the trailing
     * partial page whole), without the slots SGLang holds on the device. Checked like {@link #free}.
     *
     * @param requestId the request whose row segment is freed
     * @param startPos first token position, a multiple of the page size
     * @param count tokens in the segment
     * @return rejected pages as {@link #free} counts them; or -1 when the request's list does not
     *     hold every page of the segment (nothing released): the caller frees by slots instead
     * @throws IllegalArgumentException for a negative or unaligned segment
     */
    public int freeSegment(long requestId, long startPos, long count, int releasingTenant, int flags) {
        boundary(flags);
        checkBound();
        if (requestId < 0 || startPos < 0 || count < 0 || startPos % pageSizeTokens != 0 || startPos + count > slotCount) {
            throw new IllegalArgumentException("free_segment of request " + requestId + " needs request >= 0 and an aligned"
                    + " segment inside the pool: start_pos=" + startPos + " count=" + count + " page_size=" + pageSizeTokens);
        }
        if (count == 0) {
            return 0;
        }
        long lo = startPos / pageSizeTokens;
        long hi = ceilDiv(startPos + count, pageSizeTokens);
        int n = 0;
        for (int p = validHead(requestId); p >= 0 && positionOfPage[p] >= lo; p = validNext(requestId, p)) {
            if (positionOfPage[p] < hi) {
                io.put(n++, (long) p * pageSizeTokens);
            }
        }
        if (n != hi - lo) {
            return -1;
        }
        return free(n, releasingTenant, 0);
    }

    /** The page holding token position {@code position * pageSizeTokens} of {@code requestId}, or -1. */
    public int pageAt(long requestId, long position) {
        for (int p = validHead(requestId); p >= 0 && positionOfPage[p] >= position; p = validNext(requestId, p)) {
            if (positionOfPage[p] == position) {
                return p;
            }
        }
        return -1;
    }

    private boolean stillOfRequest(long requestId, int page) {
        return owned[page] && ownerByPage[page] == Owners.request(requestId);
    }

    /** The request's highest-position page still its own, dropping pages that left it. */
    private int validHead(long requestId) {
        int p = listGet(requestId);
        while (p >= 0 && !stillOfRequest(requestId, p)) {
            int next = nextOfPage[p];
            unlink(p);
            p = next;
        }
        return p;
    }

    private int validNext(long requestId, int page) {
        int p = nextOfPage[page];
        while (p >= 0 && !stillOfRequest(requestId, p)) {
            int next = nextOfPage[p];
            unlink(p);
            p = next;
        }
        return p;
    }

    /** Puts {@code page} into the request's list at {@code position} (almost always at the head). */
    private void link(long requestId, int page, int position) {
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
            listPut(requestId, page);
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

    private void unlink(int page) {
        long requestId = listOfPage[page];
        if (requestId < 0) {
            return;
        }
        int prev = prevOfPage[page];
        int next = nextOfPage[page];
        if (prev >= 0) {
            nextOfPage[prev] = next;
        } else if (next >= 0) {
            listPut(requestId, next);
        } else {
            listRemove(requestId);
        }
        if (next >= 0) {
            prevOfPage[next] = prev;
        }
        listOfPage[page] = -1;
    }

    private int slotOf(long requestId) {
        long h = requestId * 0x9E3779B97F4A7C15L;
        return (int) (h ^ (h >>> 32)) & listMask;
    }

    private int listGet(long requestId) {
        for (int i = slotOf(requestId); listKeys[i] >= 0; i = (i + 1) & listMask) {
            if (listKeys[i] == requestId) {
                return listHeads[i];
            }
        }
        return -1;
    }

    /** At most one entry per page-owning request, so the table (twice the pages) never fills. */
    private void listPut(long requestId, int head) {
        int i = slotOf(requestId);
        while (listKeys[i] >= 0 && listKeys[i] != requestId) {
            i = (i + 1) & listMask;
        }
        listKeys[i] = requestId;
        listHeads[i] = head;
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
                hole = j;
            }
        }
        listKeys[hole] = -1;
    }

    /** Releases every owned page (SGLang's {@code clear()}), then runs a step boundary. */
    public void releaseAll() {
        int n = 0;
        for (int p = 0; p < pageCount; p++) {
            if (owned[p]) {
                pages[n++] = p;
            }
        }
        releaseGrouped(n, ReleaseReason.EVICTED);
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
        return pool.endStep();
    }

    private void boundary(int flags) {
        if ((flags & STEP_BOUNDARY) != 0) {
            pool.endStep();
        }
    }

    private void checkBound() {
        if (io == null) {
            throw new IllegalStateException("bind(io, plan) was not called");
        }
    }

    /** SGLang's {@code available_size()}: token slots {@code alloc} can hand out now. */
    public long availableTokens() {
        return pool.availableTokens();
    }

    /** Whole pages {@code alloc} can hand out now. */
    public int availablePages() {
        return pool.available();
    }

    /** The current handle of {@code page} while it is owned through this allocator, else {@link PageHandles#NONE}. */
    public long handleOf(int page) {
        return isOwned(page) ? handleByPage[page] : PageHandles.NONE;
    }

    /**
     * Mirrors pool calls made outside this allocator (a handoff reservation, the prefix cache) for
     * the pages of {@code handles[offset, offset + count)}: a handle still current records the page
     * as owned by whoever the pool says owns it; a page whose recorded handle is no longer current
     * is no longer owned.
     */
    public void sync(long[] handles, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            long h = handles[i];
            if (h == PageHandles.NONE) {
                continue;
            }
            int page = PageHandles.page(h);
            if (pool.isCurrent(h) && pool.ownerTenantOf(page) >= 0) {
                handleByPage[page] = h;
                tenantByPage[page] = pool.ownerTenantOf(page);
                ownerByPage[page] = pool.ownerOf(page);
                owned[page] = true;
            } else if (handleByPage[page] == h) {
                owned[page] = false;
            }
        }
    }

    /**
     * Drops every page whose recorded handle the pool no longer holds current (after a prefix-cache
     * eviction, which releases pages this allocator cannot name); O(pages), not a per-step call.
     *
     * @return pages dropped
     */
    public int syncReleased() {
        int dropped = 0;
        for (int p = 0; p < pageCount; p++) {
            if (owned[p] && !pool.isCurrent(handleByPage[p])) {
                owned[p] = false;
                dropped++;
            }
        }
        return dropped;
    }

    /**
     * The pages (page 0 excluded) whose life-cycle state is in {@code stateMask} (bit {@code 1 << ordinal} of
     * {@link dev.kvshield.lifecycle.PageState}), ascending, written to {@code out}; for SGLang's
     * {@code free_pages}/{@code release_pages} views and checks. Reads only; O(pages).
     *
     * @return how many were written
     */
    public int pagesIn(int stateMask, int[] out) {
        int n = 0;
        for (int p = 1; p < pageCount; p++) {
            if ((stateMask >>> pool.stateOf(p).ordinal() & 1) != 0) {
                out[n++] = p;
            }
        }
        return n;
    }

    /** True while {@code page} is owned through this allocator. */
    public boolean isOwned(int page) {
        return page >= 0 && page < pageCount && owned[page];
    }

    /** The tenant owning {@code page}, or -1. */
    public int tenantOf(int page) {
        return isOwned(page) ? tenantByPage[page] : -1;
    }

    /** The request id owning {@code page}, or -1 (not owned, or owned by a namespace). */
    public long requestOf(int page) {
        return isOwned(page) && !Owners.isNamespace(ownerByPage[page]) ? Owners.id(ownerByPage[page]) : -1;
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

    /** The pool's message for the last rejected free, or empty. */
    public String lastRejection() {
        return lastRejection;
    }

    /** Admission limits: what the pool admits and what the engine advertises. */
    public AdmissionLimits admission() {
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
            pool.close();
            throw new IllegalStateException("cannot serve metrics on loopback port " + (settings.metricsBasePort + settings.rank) + ": "
                    + e.getMessage(), e);
        }
    }

    /** Stops the metrics endpoint and the pool's protection worker; closes the memory if {@link #open} built it. */
    @Override
    public void close() {
        if (metricsEndpoint != null) {
            metricsEndpoint.close();
        }
        try {
            pool.close();
        } finally {
            if (auditTrail != null) {
                auditTrail.close(); // NOTE: after the pool, so the trail's last signed checkpoint covers its final events
            }
            if (ownsMemory) {
                memory.close();
            }
        }
    }

    /** The pool's signed audit trail, or null when none was configured. */
    public AuditTrail auditTrail() {
        return auditTrail;
    }
}
