package dev.kvshield.pool;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantRegistry;
import dev.kvshield.tenant.UnknownTenantException;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * The pool's argument checks: tenants, holders, array ranges, slot ranges, and pages listed twice
 * in one batch. Each throws before the pool changes anything, naming the values. Guarded by the
 * pool lock; does not allocate unless it throws.
 */
final class Guards {
    private final TenantRegistry tenants;
    private final PoolGeometry geometry;
    private final PageTable table;
    private final PageEvents events;
    private final PoolMetrics metrics;
    private final int[] pageMark;
    private int pageStamp;
    private boolean[] sharedNamespace = new boolean[0];

    Guards(TenantRegistry tenants, PoolGeometry geometry, PageTable table, PageEvents events, PoolMetrics metrics) {
        this.tenants = tenants;
        this.geometry = geometry;
        this.table = table;
        this.events = events;
        this.metrics = metrics;
        pageMark = new int[geometry.pageCount()];
    }

    void tenant(int tenant) {
        if (!tenants.isRegistered(tenant)) {
            metrics.rejected(Rejection.UNKNOWN_TENANT);
            throw new UnknownTenantException("unknown tenant id " + tenant + " (" + tenants.size() + " registered)");
        }
    }

    /** Makes {@code tenant} a shared namespace: non-regulated tenants may read its pages. */
    void declareShared(int tenant) {
        tenant(tenant);
        if (tenants.policy(tenant).regulated()) {
            throw new IllegalArgumentException("regulated tenant " + tenant + " cannot be a shared namespace");
        }
        if (tenant >= sharedNamespace.length) {
            sharedNamespace = Arrays.copyOf(sharedNamespace, tenant + 1);
        }
        sharedNamespace[tenant] = true;
    }

    boolean isShared(int tenant) {
        return tenant >= 0 && tenant < sharedNamespace.length && sharedNamespace[tenant];
    }

    /** A holder of {@code kind}: cache namespaces hold NAMESPACE leases and nothing else; requests and transfers the rest. */
    static void holder(LeaseKind kind, long holder) {
        if (kind == null || !kind.holdsContent()) {
            throw new IllegalArgumentException("a content lease kind is required here, got " + kind + " (claims are taken with claim())");
        }
        if (!Owners.isValid(holder) || Owners.isNamespace(holder) != (kind == LeaseKind.NAMESPACE)) {
            throw new IllegalArgumentException("holder " + Owners.describe(holder) + " cannot hold a " + kind + " lease"
                    + " (NAMESPACE leases take Owners.namespace(id), every other kind Owners.request(id))");
        }
    }

    static void range(String what, int length, int offset, int count) {
        if (count < 0 || offset < 0 || offset > length - count) {
            throw new IllegalArgumentException(what + ": range [" + offset + ", " + ((long) offset + count)
                    + ") is outside an array of " + length + " (count must be >= 0)");
        }
    }

    /** Token slots a transfer of {@code byteSize} bytes covers in {@code buffer}, checked to fit one page. */
    int tokensOf(int buffer, long byteSize) {
        geometry.checkBuffer(buffer);
        int bpt = geometry.bytesPerToken(buffer);
        if (byteSize <= 0 || byteSize % bpt != 0 || byteSize / bpt > geometry.pageSizeTokens()) {
            throw new InvalidGeometryException(byteSize + " bytes is not a whole number of " + bpt + "-byte tokens of buffer " + buffer
                    + " within one page of " + geometry.pageSizeTokens() + " slots");
        }
        return (int) (byteSize / bpt);
    }

    /**
     * Token slots a transfer of every buffer covers: {@code segments[b]} for buffer {@code b}, one per
     * buffer, each a whole number of tokens within one page, all the same number of tokens, and each
     * one a copy can use now — alive, accessible from this thread and, if {@code intoSegments} (a
     * read), writable — so that no copy of the batch fails after another has moved bytes.
     *
     * @throws IllegalArgumentException for a missing array or segment, or a read-only destination
     * @throws IllegalStateException for a segment whose arena is closed
     * @throws WrongThreadException for a segment confined to another thread
     */
    int tokensOfEveryBuffer(MemorySegment[] segments, boolean intoSegments) {
        if (segments == null) {
            throw new IllegalArgumentException("a transfer of every buffer needs " + geometry.bufferCount()
                    + " segments, one per buffer, got none (null)");
        }
        if (segments.length != geometry.bufferCount()) {
            throw new InvalidGeometryException("a transfer of every buffer needs " + geometry.bufferCount() + " segments, one per buffer,"
                    + " got " + segments.length);
        }
        for (int b = 0; b < segments.length; b++) {
            usable(segments[b], b, intoSegments);
        }
        int tokens = tokensOf(0, segments[0].byteSize());
        for (int b = 1; b < segments.length; b++) {
            int t = tokensOf(b, segments[b].byteSize());
            if (t != tokens) {
                throw new InvalidGeometryException("a transfer of every buffer covers the same slots in each: buffer 0 has " + tokens
                        + " tokens, buffer " + b + " has " + t);
            }
        }
        return tokens;
    }

    private static void usable(MemorySegment segment, int buffer, boolean intoSegment) {
        String what = intoSegment ? "destination" : "source";
        if (segment == null) {
            throw new IllegalArgumentException("a transfer of every buffer: the " + what + " of buffer " + buffer + " is null");
        }
        if (!segment.scope().isAlive()) {
            throw new IllegalStateException("a transfer of every buffer: the " + what + " of buffer " + buffer + " (" + segment.byteSize()
                    + " bytes) belongs to a closed arena");
        }
        if (!segment.isAccessibleBy(Thread.currentThread())) {
            throw new WrongThreadException("a transfer of every buffer: the " + what + " of buffer " + buffer + " (" + segment.byteSize()
                    + " bytes) is confined to another thread than " + Thread.currentThread().getName());
        }
        if (intoSegment && segment.isReadOnly()) {
            throw new IllegalArgumentException("a transfer of every buffer: the destination of buffer " + buffer + " (" + segment.byteSize()
                    + " bytes) is read-only");
        }
    }

    /** Starts a batch's page check: {@link #pageOnce} refuses a page listed twice in it. */
    void beginPages() {
        if (++pageStamp == Integer.MAX_VALUE) {
            Arrays.fill(pageMark, 0);
            pageStamp = 1;
        }
    }

    void pageOnce(int page, long lease, int tenant, long holder, String what) {
        if (pageMark[page] == pageStamp) {
            throw events.reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, table.generation(page), tenant, holder,
                    lease, new DuplicateLeaseException(lease, what + ": page " + page + " is listed twice in one call (lease "
                            + lease + ")"));
        }
        pageMark[page] = pageStamp;
    }

    /** Whether {@link #pageOnce} marked the page in the current batch. */
    boolean marked(int page) {
        return pageMark[page] == pageStamp;
    }

    void mark(int page) {
        pageMark[page] = pageStamp;
    }
}
