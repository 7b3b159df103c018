package dev.kvshield.bridge.prefix;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;

/**
 * The page operations of SGLang's radix-cache backend {@code kvshield} on one bridged pool, by page
 * id: the Python side keeps SGLang's tree (nodes, lock refs, LRU); this class moves the pages
 * underneath. A request's full pages are taken into its tenant's cache namespace (or released as
 * duplicates), lock holders are the pages' readers, evicted pages are released (sealed for their
 * tenant under {@code ENCRYPT}, with a sealed reference the next hit reclaims) and cache pages go
 * back on reset.
 *
 * <p>Page ids come from host-side state only (the tree's nodes, the allocator's per-request page
 * lists), so no call needs a device tensor. Every call checks all its pages before changing
 * anything, fails with an exception naming the offending value, and ends by mirroring the pool into
 * the {@link SlotAllocator}'s page table. Called from the scheduler thread only; one call per
 * request admission, chunk, finish or eviction round.
 */
public final class PrefixCacheBridge {
    /** The owner of every cached page: the cache namespace (distinct from unattributed pages' owner). */
    public static final long CACHE_NAMESPACE = SlotAllocator.PREFIX_CACHE;

    private final SlotAllocator slots;
    private final KvPagePool pool;
    private final int pageCount;
    private final long[] handles;
    private int sharedTenant = -1;

    public PrefixCacheBridge(SlotAllocator slots) {
        this.slots = slots;
        this.pool = slots.pool();
        this.pageCount = slots.pageCount();
        this.handles = new long[pageCount];
    }

    /** Makes {@code tenant}'s scope the shared namespace (e.g. a public system prompt) for tenants that are not regulated. */
    public void declareShared(int tenant) {
        pool.declareSharedNamespace(tenant);
        sharedTenant = tenant;
    }

    /** The shared scope {@code tenant} may consult after its own, or -1 (none declared, its own, or a regulated tenant). */
    public int sharedScopeFor(int tenant) {
        if (sharedTenant < 0 || sharedTenant == tenant || pool.tenants().policy(tenant).regulated()) {
            return -1;
        }
        return sharedTenant;
    }

    /**
     * Settles a request's pages at page positions {@code [fromPage, releaseToPage)} from its page
     * list: position {@code fromPage + i < toPage} is taken into {@code tenant}'s cache namespace when
     * {@code take[i]} is 1 (its page id written to {@code pagesOut[i]}) or released as a duplicate
     * of a cached page when 0; positions {@code [toPage, releaseToPage)} (the unaligned tail) are
     * released where the request still holds them.
     *
     * @return pages taken into the cache
     * @throws IllegalArgumentException when the request does not hold a page at a position in
     *     {@code [fromPage, toPage)} (nothing changed)
     */
    public int settle(long request, int tenant, int fromPage, int toPage, int releaseToPage, byte[] take, int[] pagesOut) {
        if (fromPage < 0 || toPage < fromPage || releaseToPage < toPage || take.length < toPage - fromPage
                || pagesOut.length < toPage - fromPage) {
            throw new IllegalArgumentException("settle of request " + request + " needs 0 <= from <= to <= releaseTo and"
                    + " arrays of to - from: from=" + fromPage + " to=" + toPage + " releaseTo=" + releaseToPage
                    + " take=" + take.length + " pagesOut=" + pagesOut.length);
        }
        long owner = Owners.request(request);
        for (int pos = fromPage; pos < toPage; pos++) {
            int page = slots.pageAt(request, pos);
            if (page < 0 || slots.tenantOf(page) != tenant) {
                throw new IllegalArgumentException("request " + request + " of tenant " + tenant + " holds no page at page"
                        + " position " + pos + " (page " + page + "): nothing settled");
            }
            pagesOut[pos - fromPage] = page;
        }
        int taken = 0;
        int released = 0;
        for (int i = 0; i < toPage - fromPage; i++) {
            long h = slots.handleOf(pagesOut[i]);
            if (take[i] == 1) {
                handles[0] = h;
                pool.transferOwnership(tenant, owner, CACHE_NAMESPACE, handles, 0, 1);
                slots.sync(handles, 0, 1);
                taken++;
            } else {
                handles[released++] = h;
            }
        }
        for (int pos = toPage; pos < releaseToPage; pos++) {
            int page = slots.pageAt(request, pos);
            if (page >= 0) {
                handles[released++] = slots.handleOf(page);
            }
        }
        if (released > 0) {
            pool.release(tenant, owner, handles, 0, released, ReleaseReason.FINISHED);
            slots.sync(handles, 0, released);
        }
        return taken;
    }

    /**
     * Adds request {@code request} of {@code readerTenant} as a reader of cached pages {@code
     * pages[0, count)} of scope {@code scope}: a lock holder reads what it locked.
     *
     * @throws IllegalArgumentException for a page that is not a cached page of {@code scope}
     * @throws dev.kvshield.tenant.ForeignAccessException for a reader the scope does not admit (readers
     *     added by this call are removed again)
     */
    public void addReaders(int scope, int readerTenant, long request, int[] pages, int count) {
        checkCached(scope, pages, count);
        long reader = Owners.request(request);
        int added = 0;
        try {
            for (; added < count; added++) {
                pool.addReader(scope, CACHE_NAMESPACE, slots.handleOf(pages[added]), readerTenant, reader);
            }
        } finally {
            if (added < count) {
                for (int i = 0; i < added; i++) {
                    pool.removeReader(scope, CACHE_NAMESPACE, slots.handleOf(pages[i]), readerTenant, reader);
                }
            }
        }
    }

    /** Removes request {@code request} of {@code readerTenant} as a reader of cached pages {@code pages[0, count)} of {@code scope}. */
    public void removeReaders(int scope, int readerTenant, long request, int[] pages, int count) {
        checkCached(scope, pages, count);
        long reader = Owners.request(request);
        for (int i = 0; i < count; i++) {
            pool.removeReader(scope, CACHE_NAMESPACE, slots.handleOf(pages[i]), readerTenant, reader);
        }
    }

    /**
     * Evicts cached pages {@code pages[0, count)}: each is released (scrubbed at its tenant's level);
     * under {@code ENCRYPT} its sealed reference is written to {@code sealedOut[i]}, else {@link
     * PageHandles#NONE} (the prefix is gone).
     *
     * @return pages that left a sealed reference
     */
    public int evict(int[] pages, int count, long[] sealedOut) {
        for (int i = 0; i < count; i++) {
            checkCached(slots.tenantOf(pages[i]), pages, i, 1);
        }
        int sealed = 0;
        for (int i = 0; i < count; i++) {
            int tenant = slots.tenantOf(pages[i]);
            handles[0] = slots.handleOf(pages[i]);
            boolean seals = pool.levelOf(tenant) == ProtectionLevel.ENCRYPT;
            pool.release(tenant, CACHE_NAMESPACE, handles, 0, 1, ReleaseReason.EVICTED);
            slots.sync(handles, 0, 1);
            sealedOut[i] = seals ? PageHandles.sealedReference(handles[0]) : PageHandles.NONE;
            sealed += seals ? 1 : 0;
        }
        return sealed;
    }

    /**
     * Reclaims (decrypts) sealed references {@code sealedRefs[0, count)} of scope {@code scope}'s
     * cache: {@code pagesOut[i]} is the page back in the cache namespace, or -1 when the page is gone
     * (it went to another owner since; the engine recomputes).
     *
     * @return references reclaimed
     */
    public int reclaim(int scope, long[] sealedRefs, int count, int[] pagesOut) {
        int n = pool.reclaim(scope, CACHE_NAMESPACE, sealedRefs, 0, count, handles, 0);
        slots.sync(handles, 0, count);
        for (int i = 0; i < count; i++) {
            pagesOut[i] = handles[i] == PageHandles.NONE ? -1 : PageHandles.page(handles[i]);
        }
        return n;
    }

    private void checkCached(int scope, int[] pages, int count) {
        checkCached(scope, pages, 0, count);
    }

    private void checkCached(int scope, int[] pages, int offset, int count) {
        if (count < 0 || offset + count > pages.length) {
            throw new IllegalArgumentException("count " + count + " exceeds the " + pages.length + " pages given");
        }
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            if (page < 0 || page >= pageCount || slots.tenantOf(page) != scope || pool.ownerOf(page) != CACHE_NAMESPACE) {
                throw new IllegalArgumentException("page " + page + " (index " + i + ") is not a cached page of tenant "
                        + scope + ": nothing changed");
            }
        }
    }
}
