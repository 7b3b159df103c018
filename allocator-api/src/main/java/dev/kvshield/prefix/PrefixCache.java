package dev.kvshield.prefix;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Caches whole pages of finished requests' sequences, keyed per scope by a hash chain over page
 * blocks of token ids (block {@code i}'s key covers tokens {@code [0, (i+1) * pageSize)}), and
 * verified against the stored tokens, so a hash collision is a miss, never a hit.
 *
 * <p>Scopes: every tenant has its own; one tenant may be declared the shared namespace
 * ({@link KvPagePool#declareSharedNamespace}); a lookup consults the shared scope only when the
 * tenant's own scope has no first block and the tenant is not regulated. Cached pages are owned by
 * their scope tenant's cache namespace; a request that matched them is added as a reader until
 * {@link #unmatch}. Eviction takes least recently used entries without readers: under the scope's
 * {@code ENCRYPT} level the page is released into a sealed page and the entry keeps its sealed
 * reference; the next match reclaims it, or drops the entry if the page is gone (the engine
 * recomputes). At other levels an evicted prefix is gone.
 *
 * <p>Thread-safe (one lock). Not a hot path per token: one call per request admission or finish.
 */
public final class PrefixCache {
    private static final long NAMESPACE = Owners.namespace(0);

    private final KvPagePool pool;
    private final int pageSize;
    private final Map<Key, Entry> entries = new HashMap<>();
    private int sharedTenant = -1;
    private long clock;
    private long hits;
    private long misses;
    private long reclaimHits;
    private long reclaimGone;
    private long evictions;

    record Key(int scope, long chainHash) {}

    private static final class Entry {
        final int scope;
        final int[] tokens;
        long handle;
        long sealedRef = PageHandles.NONE;
        int readers;
        long lastUse;

        Entry(int scope, int[] tokens, long handle) {
            this.scope = scope;
            this.tokens = tokens;
            this.handle = handle;
        }

        boolean sealed() {
            return handle == PageHandles.NONE;
        }
    }

    public PrefixCache(KvPagePool pool) {
        this.pool = pool;
        this.pageSize = pool.geometry().pageSizeTokens();
    }

    /** Makes {@code tenant}'s scope the shared namespace for tenants that are not regulated. */
    public synchronized void declareShared(int tenant) {
        pool.declareSharedNamespace(tenant);
        sharedTenant = tenant;
    }

    /**
     * Takes the full pages of a finished request into its tenant's scope: {@code handles[i]} holds
     * tokens {@code [i * pageSize, (i + 1) * pageSize)}, either a page the request owns or the cached
     * page it matched. A block already cached resident under another page is a duplicate: the
     * request's page is released. A block cached only as a sealed reference takes the request's page
     * instead (a resident page beats a reclaim that may answer "gone"). Pages stay readable by nobody
     * until matched.
     *
     * @return pages taken into the cache
     */
    public synchronized int insert(int tenant, long request, int[] tokens, long[] handles) {
        int blocks = Math.min(handles.length, tokens.length / pageSize);
        if (blocks != handles.length) {
            throw new IllegalArgumentException(handles.length + " pages given for " + tokens.length + " tokens of "
                    + pageSize + " per page: only full pages are cached");
        }
        long owner = Owners.request(request);
        long hash = 0;
        int taken = 0;
        List<Long> duplicates = new ArrayList<>();
        for (int i = 0; i < blocks; i++) {
            hash = chain(hash, tokens, i);
            Key key = new Key(tenant, hash);
            Entry e = entries.get(key);
            // NOTE: a sealed entry for the same tokens yields to the freshly computed resident page.
            if (e != null && !e.sealed() && matches(e, tokens, i)) {
                if (e.handle != handles[i]) {
                    duplicates.add(handles[i]); // computed again although cached: the request's copy goes
                }
                continue;
            }
            pool.transferOwnership(tenant, owner, NAMESPACE, handles, i, 1);
            Entry fresh = new Entry(tenant, Arrays.copyOf(tokens, (i + 1) * pageSize), handles[i]);
            fresh.lastUse = ++clock;
            if (e != null) {
                evictEntry(key, e); // a collision with other tokens: the newer sequence wins the key
            }
            entries.put(key, fresh);
            taken++;
        }
        if (!duplicates.isEmpty()) {
            long[] d = duplicates.stream().mapToLong(Long::longValue).toArray();
            pool.release(tenant, owner, d, 0, d.length, ReleaseReason.FINISHED);
        }
        return taken;
    }

    /**
     * Finds the longest cached prefix of {@code tokens} for {@code (tenant, request)}, adding the
     * request as a reader of each matched page (reclaiming sealed ones) and writing their handles
     * into {@code out}.
     *
     * @return the number of leading pages matched (0: recompute everything)
     */
    public synchronized int match(int tenant, long request, int[] tokens, long[] out) {
        int matched = matchIn(tenant, tenant, request, tokens, out);
        if (matched == 0 && sharedTenant >= 0 && sharedTenant != tenant && !pool.tenants().policy(tenant).regulated()) {
            matched = matchIn(sharedTenant, tenant, request, tokens, out);
        }
        if (matched == 0) {
            misses++;
        } else {
            hits++;
        }
        return matched;
    }

    private int matchIn(int scope, int tenant, long request, int[] tokens, long[] out) {
        int blocks = Math.min(out.length, tokens.length / pageSize);
        long hash = 0;
        int matched = 0;
        for (int i = 0; i < blocks; i++) {
            hash = chain(hash, tokens, i);
            Key key = new Key(scope, hash);
            Entry e = entries.get(key);
            if (e == null || !matches(e, tokens, i) || (e.sealed() && !reclaim(key, e))) {
                break;
            }
            pool.addReader(scope, NAMESPACE, e.handle, tenant, Owners.request(request));
            e.readers++;
            e.lastUse = ++clock;
            out[i] = e.handle;
            matched++;
        }
        return matched;
    }

    private boolean reclaim(Key key, Entry e) {
        long[] back = new long[1];
        if (pool.reclaim(e.scope, NAMESPACE, new long[] {e.sealedRef}, 0, 1, back, 0) == 1) {
            e.handle = back[0];
            e.sealedRef = PageHandles.NONE;
            reclaimHits++;
            return true;
        }
        entries.remove(key);
        reclaimGone++;
        return false;
    }

    /** The request no longer reads the pages it matched. */
    public synchronized void unmatch(int tenant, long request, long[] handles, int count) {
        for (int i = 0; i < count; i++) {
            Entry e = byHandle(handles[i]);
            if (e != null && e.readers > 0) {
                pool.removeReader(e.scope, NAMESPACE, e.handle, tenant, Owners.request(request));
                e.readers--;
            }
        }
    }

    /**
     * Evicts up to {@code pages} least recently used entries that no request reads.
     *
     * @return pages released (sealed under ENCRYPT, scrubbed otherwise)
     */
    public synchronized int evict(int pages) {
        List<Map.Entry<Key, Entry>> candidates = entries.entrySet().stream()
                .filter(x -> !x.getValue().sealed() && x.getValue().readers == 0)
                .sorted(Comparator.comparingLong(x -> x.getValue().lastUse)).limit(pages).toList();
        for (Map.Entry<Key, Entry> x : candidates) {
            evictEntry(x.getKey(), x.getValue());
        }
        evictions += candidates.size();
        return candidates.size();
    }

    private void evictEntry(Key key, Entry e) {
        if (e.sealed()) {
            entries.remove(key);
            return;
        }
        pool.release(e.scope, NAMESPACE, new long[] {e.handle}, 0, 1, ReleaseReason.EVICTED);
        if (pool.levelOf(e.scope) == ProtectionLevel.ENCRYPT) {
            e.sealedRef = PageHandles.sealedReference(e.handle);
            e.handle = PageHandles.NONE;
        } else {
            entries.remove(key);
        }
    }

    private Entry byHandle(long handle) {
        for (Entry e : entries.values()) {
            if (e.handle == handle) {
                return e;
            }
        }
        return null;
    }

    private boolean matches(Entry e, int[] tokens, int block) {
        int n = (block + 1) * pageSize;
        return e.tokens.length == n && Arrays.equals(e.tokens, 0, n, tokens, 0, n);
    }

    private long chain(long parent, int[] tokens, int block) {
        long h = parent * 0x9E37_79B9_7F4A_7C15L + block;
        for (int i = block * pageSize; i < (block + 1) * pageSize; i++) {
            h = (h ^ tokens[i]) * 0xBF58_476D_1CE4_E5B9L;
            h ^= h >>> 31;
        }
        return h;
    }

    /** Cached pages, resident and sealed. */
    public synchronized int size() {
        return entries.size();
    }

    /** Cached pages still resident (not sealed): the pages the cache keeps out of circulation. */
    public synchronized int residentPages() {
        return (int) entries.values().stream().filter(e -> !e.sealed()).count();
    }

    /** Lookups that matched at least one page. */
    public synchronized long hits() {
        return hits;
    }

    public synchronized long misses() {
        return misses;
    }

    /** Sealed pages reclaimed on a hit, and sealed entries found gone. */
    public synchronized long reclaimHits() {
        return reclaimHits;
    }

    public synchronized long reclaimGone() {
        return reclaimGone;
    }

    public synchronized long evictions() {
        return evictions;
    }
}
