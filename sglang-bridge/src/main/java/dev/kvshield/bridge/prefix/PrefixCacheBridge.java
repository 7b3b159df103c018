package dev.kvshield.bridge.prefix;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.prefix.PrefixCache;
import java.util.HashMap;
import java.util.Map;

/**
 * The prefix cache of one bridged pool in SGLang's terms: page ids and request ids in, page ids
 * out. Matching is scoped by tenant (plus the operator's declared shared namespace, never for
 * regulated tenants); under {@code ENCRYPT} an evicted page becomes its tenant's sealed reference
 * and a later match reclaims (decrypts) it, or misses from there on if the page went to someone
 * else ("gone": the engine recomputes).
 *
 * <p>Called from the scheduler thread only. One call per request admission, finish or eviction.
 *
 * <p>Implementation notes: cached pages change owner (request → cache namespace) or are released
 * inside {@link PrefixCache}; every call ends by mirroring that into the {@link SlotAllocator}'s page
 * table, so the allocator's frees and diagnostics see the pool's truth.
 */
public final class PrefixCacheBridge {
    private final SlotAllocator slots;
    private final PrefixCache cache;
    private final Map<Long, long[]> matched = new HashMap<>();

    public PrefixCacheBridge(SlotAllocator slots) {
        this.slots = slots;
        this.cache = new PrefixCache(slots.pool());
    }

    /** Makes {@code tenant}'s scope the shared namespace (e.g. a public system prompt) for tenants that are not regulated. */
    public void declareShared(int tenant) {
        cache.declareShared(tenant);
    }

    /**
     * The longest cached prefix of {@code tokens} for the request: page ids written to {@code
     * pagesOut[0, n)}, the request recorded as their reader until {@link #unmatch}.
     *
     * @return {@code n}, the leading full pages matched (0: compute everything)
     */
    public int match(long request, int tenant, int[] tokens, int[] pagesOut) {
        if (matched.containsKey(request)) {
            throw new IllegalStateException("request " + request + " already holds a prefix match; unmatch it first");
        }
        long[] handles = new long[Math.min(pagesOut.length, tokens.length / slots.pageSizeTokens())];
        int n = cache.match(tenant, request, tokens, handles);
        slots.sync(handles, 0, n);
        for (int i = 0; i < n; i++) {
            pagesOut[i] = PageHandles.page(handles[i]);
        }
        if (n > 0) {
            matched.put(request, java.util.Arrays.copyOf(handles, n));
        }
        return n;
    }

    /** The request no longer reads the pages it matched (finished or aborted). */
    public void unmatch(long request, int tenant) {
        long[] handles = matched.remove(request);
        if (handles != null) {
            cache.unmatch(tenant, request, handles, handles.length);
        }
    }

    /**
     * Takes a finished request's full pages (token order; its own pages or pages it matched) into
     * its tenant's scope; a page duplicating one already cached is released.
     *
     * @return pages taken into the cache
     */
    public int insert(long request, int tenant, int[] tokens, int[] pages) {
        long[] handles = new long[pages.length];
        for (int i = 0; i < pages.length; i++) {
            handles[i] = slots.handleOf(pages[i]);
            if (handles[i] == PageHandles.NONE) {
                throw new IllegalArgumentException("page " + pages[i] + " (index " + i + ") of request " + request
                        + " is not owned now");
            }
        }
        int taken = cache.insert(tenant, request, tokens, handles);
        slots.sync(handles, 0, handles.length);
        return taken;
    }

    /**
     * Evicts up to {@code pages} least recently used pages nobody reads (sealed under ENCRYPT,
     * scrubbed otherwise).
     *
     * @return pages released
     */
    public int evict(int pages) {
        int n = cache.evict(pages);
        if (n > 0) {
            slots.syncReleased();
        }
        return n;
    }

    /** Lookups that matched at least one page. */
    public long hits() {
        return cache.hits();
    }

    public long misses() {
        return cache.misses();
    }

    /** Sealed pages reclaimed (decrypted) on a hit. */
    public long reclaimHits() {
        return cache.reclaimHits();
    }

    /** Sealed entries found gone (the page went to another owner): recomputed. */
    public long reclaimGone() {
        return cache.reclaimGone();
    }

    public long evictions() {
        return cache.evictions();
    }

    /** Cached pages, resident and sealed. */
    public int size() {
        return cache.size();
    }

    /** Cached pages still resident (held out of circulation). */
    public int residentPages() {
        return cache.residentPages();
    }
}
