package dev.kvshield.prefix;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
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
 * tenant's own scope has no first block and the tenant is not regulated. Cached pages are held by
 * their scope tenant's cache namespace (a {@link LeaseKind#NAMESPACE} lease); a request that
 * matched them holds a {@link LeaseKind#READER} lease on each until {@link #unmatch} presents them
 * back. Eviction takes least recently used entries no one else holds: under a sealing level the
 * page is released into a sealed page and the entry keeps its sealed reference; the next match
 * reclaims it, or drops the entry if the page is gone (the engine recomputes). At other levels an
 * evicted prefix is gone.
 *
 * <p>Every call checks its whole input before the pool changes anything. Thread-safe (one lock).
 * Not a hot path per token: one call per request admission or finish.
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
        final Key key;
        final int[] tokens;
        long lease;
        long sealedRef = PageHandles.NONE;
        long lastUse;

        Entry(Key key, int[] tokens, long lease) {
            this.key = key;
            this.tokens = tokens;
            this.lease = lease;
        }

        boolean sealed() {
            return lease == LeaseIds.NONE;
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
     * Takes the full pages of a finished request's sequence into its tenant's scope: {@code
     * leases[i]} is the request's lease on the page holding tokens {@code [i * pageSize, (i + 1) *
     * pageSize)}: its owner lease, or the reader lease {@link #match} gave it for a cached block
     * (left as it is: {@link #unmatch} ends it). A block already cached resident under another page
     * is a duplicate: the request's page is released. A block cached only as a sealed reference takes the request's page instead (a
     * resident page beats a reclaim that may answer "gone"); a block whose key another sequence
     * holds takes the key. All or nothing.
     *
     * @return pages taken into the cache
     */
    public synchronized int insert(int tenant, long request, int[] tokens, long[] leases) {
        if (leases.length != tokens.length / pageSize) {
            throw new IllegalArgumentException(leases.length + " pages given for " + tokens.length + " tokens of " + pageSize
                    + " per page: only full pages are cached, one lease each");
        }
        long owner = Owners.request(request);
        pool.checkHeld(tenant, owner, leases, 0, leases.length);
        long[] taken = new long[leases.length];
        long[] duplicates = new long[leases.length];
        Key[] takenKeys = new Key[leases.length];
        int[] takenBlocks = new int[leases.length];
        List<Entry> displaced = new ArrayList<>();
        int nTaken = 0;
        int nDuplicates = 0;
        long hash = 0;
        for (int i = 0; i < leases.length; i++) {
            hash = chain(hash, tokens, i);
            Key key = new Key(tenant, hash);
            Entry e = entries.get(key);
            if (pool.view().kindOf(leases[i]) == LeaseKind.READER) {
                continue; // matched from the cache: already cached
            }
            if (e != null && !e.sealed() && matches(e, tokens, i)) {
                duplicates[nDuplicates++] = leases[i];
                continue;
            }
            if (e != null) {
                displaced.add(e); // sealed, or a collision with other tokens: the fresh page takes the key
            }
            takenKeys[nTaken] = key;
            takenBlocks[nTaken] = i;
            taken[nTaken++] = leases[i];
        }
        long[] cached = new long[nTaken];
        pool.transfer(tenant, owner, taken, 0, nTaken, LeaseKind.NAMESPACE, NAMESPACE, cached, 0);
        pool.release(tenant, owner, duplicates, 0, nDuplicates, ReleaseReason.FINISHED);
        evictEntries(displaced);
        for (int k = 0; k < nTaken; k++) {
            Entry fresh = new Entry(takenKeys[k], Arrays.copyOf(tokens, (takenBlocks[k] + 1) * pageSize), cached[k]);
            fresh.lastUse = ++clock;
            entries.put(takenKeys[k], fresh);
        }
        return nTaken;
    }

    /**
     * Finds the longest cached prefix of {@code tokens} for {@code (tenant, request)}: reclaims
     * sealed blocks, then gives the request a reader lease on each matched page, written into
     * {@code readerLeasesOut}.
     *
     * @return the number of leading pages matched (0: recompute everything)
     */
    public synchronized int match(int tenant, long request, int[] tokens, long[] readerLeasesOut) {
        int matched = matchIn(tenant, tenant, request, tokens, readerLeasesOut);
        if (matched == 0 && sharedTenant >= 0 && sharedTenant != tenant && !pool.tenants().policy(tenant).regulated()) {
            matched = matchIn(sharedTenant, tenant, request, tokens, readerLeasesOut);
        }
        if (matched == 0) {
            misses++;
        } else {
            hits++;
        }
        return matched;
    }

    private int matchIn(int scope, int tenant, long request, int[] tokens, long[] out) {
        long reader = Owners.request(request);
        int blocks = Math.min(out.length, tokens.length / pageSize);
        List<Entry> run = new ArrayList<>();
        long hash = 0;
        for (int i = 0; i < blocks; i++) {
            hash = chain(hash, tokens, i);
            Entry e = entries.get(new Key(scope, hash));
            if (e == null || !matches(e, tokens, i)) {
                break;
            }
            run.add(e);
        }
        // The reclaim changes the pool: refuse first whatever the share after it would refuse.
        long[] resident = run.stream().filter(e -> !e.sealed()).mapToLong(e -> e.lease).toArray();
        pool.checkShare(scope, NAMESPACE, resident, 0, resident.length, LeaseKind.READER, tenant, reader);
        if (!run.isEmpty()) { // NOTE: the share names the reclaimed blocks too, which checkShare cannot see yet
            pool.checkShareReader(tenant);
        }
        pool.checkLeaseRoom(run.size() - resident.length + run.size(), 0);
        int matched = reclaimSealed(scope, run);
        long[] proofs = new long[matched];
        for (int i = 0; i < matched; i++) {
            proofs[i] = run.get(i).lease;
            run.get(i).lastUse = ++clock;
        }
        pool.share(scope, NAMESPACE, proofs, 0, matched, LeaseKind.READER, tenant, reader, out, 0);
        return matched;
    }

    /** Reclaims the sealed entries of a matched run in one pool call; returns the run's length up to the first one gone. */
    private int reclaimSealed(int scope, List<Entry> run) {
        List<Entry> sealedEntries = run.stream().filter(Entry::sealed).toList();
        if (sealedEntries.isEmpty()) {
            return run.size();
        }
        long[] refs = sealedEntries.stream().mapToLong(e -> e.sealedRef).toArray();
        long[] back = new long[refs.length];
        pool.reclaim(scope, NAMESPACE, LeaseKind.NAMESPACE, refs, 0, refs.length, back, 0);
        for (int i = 0; i < refs.length; i++) {
            Entry e = sealedEntries.get(i);
            if (back[i] == LeaseIds.NONE) {
                entries.remove(e.key);
                reclaimGone++;
            } else {
                e.lease = back[i];
                e.sealedRef = PageHandles.NONE;
                reclaimHits++;
            }
        }
        for (int i = 0; i < run.size(); i++) {
            if (run.get(i).sealed()) {
                return i;
            }
        }
        return run.size();
    }

    /** The request no longer reads the pages it matched: presents the reader leases {@link #match} gave it. */
    public synchronized void unmatch(int tenant, long request, long[] readerLeases, int count) {
        pool.release(tenant, Owners.request(request), readerLeases, 0, count, ReleaseReason.FINISHED);
    }

    /**
     * Evicts up to {@code pages} least recently used entries that no request reads.
     *
     * @return pages released (sealed under a sealing level, scrubbed otherwise)
     */
    public synchronized int evict(int pages) {
        List<Entry> candidates = entries.values().stream()
                .filter(e -> !e.sealed() && pool.view().contentHolds(pool.view().pageOf(e.lease)) == 1)
                .sorted(Comparator.comparingLong(e -> e.lastUse)).limit(pages).toList();
        evictEntries(candidates);
        evictions += candidates.size();
        return candidates.size();
    }

    /** Releases the entries' pages in one call per scope; sealed entries are just dropped. */
    private void evictEntries(List<Entry> victims) {
        Map<Integer, List<Entry>> byScope = new HashMap<>();
        for (Entry e : victims) {
            if (e.sealed()) {
                entries.remove(e.key);
            } else {
                byScope.computeIfAbsent(e.key.scope(), s -> new ArrayList<>()).add(e);
            }
        }
        for (Map.Entry<Integer, List<Entry>> scope : byScope.entrySet()) {
            List<Entry> list = scope.getValue();
            long[] ls = list.stream().mapToLong(e -> e.lease).toArray();
            boolean seals = pool.protectionOf(scope.getKey()).seals();
            long[] refs = Arrays.stream(ls).map(l -> PageHandles.sealedReference(pool.view().handleOf(l))).toArray();
            pool.release(scope.getKey(), NAMESPACE, ls, 0, ls.length, ReleaseReason.EVICTED);
            for (int i = 0; i < list.size(); i++) {
                Entry e = list.get(i);
                e.lease = LeaseIds.NONE;
                if (seals) {
                    e.sealedRef = refs[i];
                } else {
                    entries.remove(e.key);
                }
            }
        }
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
