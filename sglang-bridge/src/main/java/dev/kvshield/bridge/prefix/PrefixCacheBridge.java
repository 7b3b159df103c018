package dev.kvshield.bridge.prefix;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolView;
import dev.kvshield.tenant.Owners;

/**
 * The page operations of SGLang's radix-cache backend {@code kvshield} on one bridged pool, by page
 * id: the Python side keeps SGLang's tree (nodes, lock refs, LRU); this class moves the pages
 * underneath. A request's full pages pass to its tenant's cache namespace (or are released as
 * duplicates), lock holders read the pages through reader leases, evicted pages are released
 * (sealed for their tenant under a sealing level, with a sealed reference the next hit reclaims) and
 * cache pages go back on reset.
 *
 * <p>Page ids come from host-side state only (the tree's nodes, the allocator's per-request page
 * lists), so no call needs a device tensor. Every call checks its request id (never one of the
 * pool's own holders, {@link SlotAllocator#requestHolder}), its arrays' lengths and all its pages
 * before changing anything and fails with an exception naming the offending value. Called from the
 * scheduler thread only; one call per request admission, chunk, finish or eviction round.
 *
 * <p>Implementation notes: leases are looked up in the pool each call ({@link PoolView#leasesOf}),
 * never kept here: the namespace's on a cached page, a request's owner lease at a position of its
 * page list, a reader's on the pages it locked.
 */
public final class PrefixCacheBridge {
    /**
     * The holder of every page this cache keeps: its own namespace, not the engine cache's
     * ({@link SlotAllocator#ENGINE_CACHE}), so only this class releases its pages and a bare slot
     * free of one (an SGLang double free) is refused.
     */
    public static final long CACHE_NAMESPACE = Owners.namespace(2);

    private final SlotAllocator slots;
    private final KvPagePool pool;
    private final PoolView view;
    private final int pageCount;
    private final long[] leases;
    private final long[] out;
    private final int[] pages;
    private final int[] tenants;
    private final int[] settled;
    private int sharedTenant = -1;

    public PrefixCacheBridge(SlotAllocator slots) {
        this.slots = slots;
        this.pool = slots.pool();
        this.view = pool.view();
        this.pageCount = slots.pageCount();
        this.leases = new long[pageCount];
        this.out = new long[pageCount];
        this.pages = new int[pageCount];
        this.tenants = new int[pageCount];
        this.settled = new int[pageCount];
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
     * list: position {@code fromPage + i < toPage} passes to {@code tenant}'s cache namespace when
     * {@code take[i]} is 1 (its page id written to {@code pagesOut[i]}) or is released as a duplicate
     * of a cached page when 0; positions {@code [toPage, releaseToPage)} (the unaligned tail) are
     * released where the request's page list still names a page. Every page settled must be an owner
     * hold of {@code (tenant, request)}: only those leave the request's page list. All or nothing.
     *
     * <p>A position to take whose page the request itself freed inside its release (SGLang's stale
     * free of an earlier request's slots the pool has since given this one) ends what the cache
     * takes: from it to {@code toPage} nothing is settled ({@code pagesOut} -1 there), the request
     * keeps those pages for its release, and the free stands. A position to release whose page it
     * freed so is already going.
     *
     * @return pages taken into the cache
     * @throws IllegalArgumentException for a reserved or negative request id, bounds or arrays that do
     *     not fit, a {@code take} value other than 0 or 1, a position in {@code [fromPage, toPage)}
     *     without a page the request freed inside its release, or a listed page {@code (tenant,
     *     request)} does not hold (nothing changed)
     * @throws dev.kvshield.tenant.UnknownTenantException for an unregistered tenant (nothing changed)
     */
    public int settle(long request, int tenant, int fromPage, int toPage, int releaseToPage, byte[] take, int[] pagesOut) {
        long owner = SlotAllocator.requestHolder(request);
        pool.tenants().check(tenant);
        if (fromPage < 0 || toPage < fromPage || releaseToPage < toPage || toPage - fromPage > pageCount
                || take.length < toPage - fromPage || pagesOut.length < toPage - fromPage) {
            throw new IllegalArgumentException("settle of request " + request + " needs 0 <= from <= to <= releaseTo, to - from"
                    + " <= " + pageCount + " pages and arrays of to - from: from=" + fromPage + " to=" + toPage + " releaseTo=" + releaseToPage
                    + " take=" + take.length + " pagesOut=" + pagesOut.length);
        }
        for (int i = 0; i < toPage - fromPage; i++) {
            if (take[i] != 0 && take[i] != 1) {
                throw new IllegalArgumentException("settle of request " + request + ": take[" + i + "] is " + take[i]
                        + ", not 0 (release) or 1 (take): nothing settled");
            }
        }
        int n = 0;
        int end = toPage; // NOTE: the first position to take that the request freed itself; the cache takes nothing from it
        for (int pos = fromPage; pos < releaseToPage; pos++) {
            if (pos >= end && pos < toPage) {
                settled[pos - fromPage] = -1;
                continue;
            }
            int page = slots.pageAt(request, pos);
            if (page < 0 && pos < toPage) {
                if (!slots.freedInRelease(request, tenant, pos)) {
                    throw new IllegalArgumentException("request " + request + " of tenant " + tenant + " holds no page at page"
                            + " position " + pos + ": nothing settled");
                }
                end = take[pos - fromPage] == 1 ? pos : end;
            }
            if (pos < toPage) {
                settled[pos - fromPage] = page;
            }
            if (page >= 0) {
                pages[n++] = page;
            }
        }
        // NOTE: the page list is the allocator's bookkeeping, the pool's holds are the truth: a page listed for the
        // request but not held by (tenant, request) (a wrong tenant) is refused, never dropped from the list
        view.leasesOf(pages, 0, n, tenant, owner, LeaseKind.OWNER, leases, 0);
        for (int i = 0; i < n; i++) {
            if (leases[i] == LeaseIds.NONE) {
                throw new IllegalArgumentException("request " + request + " of tenant " + tenant + " does not hold page " + pages[i]
                        + " listed in its page positions [" + fromPage + ", " + releaseToPage + "): nothing settled");
            }
        }
        int taken = 0;
        int released = 0;
        for (int i = 0, pos = fromPage; i < n; i++, pos++) {
            while (pos < toPage && settled[pos - fromPage] < 0) {
                pos++;
            }
            if (pos < toPage && take[pos - fromPage] == 1) {
                out[taken++] = leases[i];
            } else {
                leases[released++] = leases[i];
            }
        }
        pool.checkHeld(tenant, owner, out, 0, taken);
        pool.checkHeld(tenant, owner, leases, 0, released);
        pool.transfer(tenant, owner, out, 0, taken, LeaseKind.NAMESPACE, CACHE_NAMESPACE, out, 0);
        pool.release(tenant, owner, leases, 0, released, ReleaseReason.FINISHED);
        for (int i = 0; i < n; i++) {
            slots.forgetPage(pages[i]);
        }
        System.arraycopy(settled, 0, pagesOut, 0, toPage - fromPage);
        return taken;
    }

    /**
     * Gives request {@code request} of {@code readerTenant} a reader lease on cached pages {@code
     * pages[0, count)} of scope {@code scope}: a lock holder reads what it locked. All or nothing.
     *
     * @throws IllegalArgumentException for a reserved or negative request id, a count outside {@code
     *     readPages}, or a page that is not a cached page of {@code scope}
     * @throws dev.kvshield.tenant.ForeignAccessException for a reader the scope does not admit
     */
    public void addReaders(int scope, int readerTenant, long request, int[] readPages, int count) {
        long reader = SlotAllocator.requestHolder(request);
        cachedLeases(scope, readPages, count);
        pool.share(scope, CACHE_NAMESPACE, leases, 0, count, LeaseKind.READER, readerTenant, reader, out, 0);
    }

    /**
     * Ends request {@code request}'s reader leases on cached pages {@code pages[0, count)}: all or nothing.
     *
     * @throws IllegalArgumentException for a reserved or negative request id or a count outside {@code readPages}
     */
    public void removeReaders(int scope, int readerTenant, long request, int[] readPages, int count) {
        long reader = SlotAllocator.requestHolder(request);
        checkCount(readPages, count);
        view.leasesOf(readPages, 0, count, readerTenant, reader, LeaseKind.READER, leases, 0);
        pool.release(readerTenant, reader, leases, 0, count, ReleaseReason.FINISHED);
    }

    /**
     * Evicts cached pages {@code pages[0, count)}: each is released (protected at its tenant's
     * level); under a sealing level its sealed reference is written to {@code sealedOut[i]}, else
     * {@link PageHandles#NONE} (the prefix is gone). All or nothing: a page listed twice or not
     * cached changes nothing.
     *
     * @return pages that left a sealed reference
     * @throws IllegalArgumentException for a count outside {@code evictPages} or {@code sealedOut}
     */
    public int evict(int[] evictPages, int count, long[] sealedOut) {
        checkCount(evictPages, count);
        checkOut("sealedOut", sealedOut.length, count);
        view.leasesOf(evictPages, 0, count, -1, CACHE_NAMESPACE, LeaseKind.NAMESPACE, leases, 0);
        for (int i = 0; i < count; i++) {
            if (leases[i] == LeaseIds.NONE) {
                throw new IllegalArgumentException("page " + evictPages[i] + " (index " + i + ") is not a cached page: nothing"
                        + " evicted");
            }
        }
        view.tenantsOf(evictPages, 0, count, tenants, 0);
        for (int pass = 0; pass < 2; pass++) { // check every tenant's group, then release them: all or nothing
            for (int i = 0; i < count; i++) {
                if (tenants[i] < 0 || firstOfTenant(i)) {
                    int n = 0;
                    for (int j = i; j < count; j++) {
                        if (tenants[j] == tenants[i]) {
                            out[n++] = leases[j];
                        }
                    }
                    if (pass == 0) {
                        pool.checkHeld(tenants[i], CACHE_NAMESPACE, out, 0, n);
                    } else {
                        pool.release(tenants[i], CACHE_NAMESPACE, out, 0, n, ReleaseReason.EVICTED);
                    }
                }
            }
            if (pass == 0) {
                for (int i = 0; i < count; i++) {
                    sealedOut[i] = pool.protectionOf(tenants[i]).seals() ? PageHandles.sealedReference(view.handleOf(leases[i]))
                            : PageHandles.NONE;
                }
            }
        }
        int sealedRefs = 0;
        for (int i = 0; i < count; i++) {
            sealedRefs += sealedOut[i] != PageHandles.NONE ? 1 : 0;
        }
        return sealedRefs;
    }

    private boolean firstOfTenant(int i) {
        for (int j = 0; j < i; j++) {
            if (tenants[j] == tenants[i]) {
                return false;
            }
        }
        return true;
    }

    /**
     * Reclaims (decrypts) sealed references {@code sealedRefs[0, count)} of scope {@code scope}'s
     * cache: {@code pagesOut[i]} is the page back in the cache namespace, or -1 when the page is gone
     * (it went to another owner since; the engine recomputes).
     *
     * @return references reclaimed
     * @throws IllegalArgumentException for a count outside {@code sealedRefs} or {@code pagesOut}
     *     (nothing reclaimed)
     */
    public int reclaim(int scope, long[] sealedRefs, int count, int[] pagesOut) {
        if (count < 0 || count > sealedRefs.length || count > pageCount) {
            throw new IllegalArgumentException("reclaim count " + count + " is outside [0, " + Math.min(sealedRefs.length, pageCount)
                    + "] (" + sealedRefs.length + " sealed references given, " + pageCount + " pages): nothing reclaimed");
        }
        checkOut("pagesOut", pagesOut.length, count);
        int n = pool.reclaim(scope, CACHE_NAMESPACE, LeaseKind.NAMESPACE, sealedRefs, 0, count, out, 0);
        for (int i = 0; i < count; i++) {
            pagesOut[i] = out[i] == LeaseIds.NONE ? -1 : view.pageOf(out[i]);
        }
        return n;
    }

    /** The cache namespace's leases on {@code pages[0, count)} of {@code scope} into {@link #leases}; refuses others. */
    private void cachedLeases(int scope, int[] cached, int count) {
        checkCount(cached, count);
        view.leasesOf(cached, 0, count, scope, CACHE_NAMESPACE, LeaseKind.NAMESPACE, leases, 0);
        for (int i = 0; i < count; i++) {
            if (leases[i] == LeaseIds.NONE) {
                throw new IllegalArgumentException("page " + cached[i] + " (index " + i + ") is not a cached page of tenant "
                        + scope + ": nothing changed");
            }
        }
    }

    private void checkCount(int[] given, int count) {
        if (count < 0 || count > given.length || count > pageCount) {
            throw new IllegalArgumentException("count " + count + " exceeds the " + given.length + " pages given");
        }
    }

    private static void checkOut(String name, int length, int count) {
        if (length < count) {
            throw new IllegalArgumentException(name + " holds " + length + " entries; " + count + " are written: nothing changed");
        }
    }
}
