package dev.kvshield.prefix;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestXorSealer;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** Tenant-scoped prefix matching, and what ENCRYPT keeps of an evicted prefix compared with ZERO. */
class PrefixCacheTest {
    static final PoolGeometry G = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(4).pageCount(9).build();
    static final int[] PROMPT = IntStream.range(100, 112).toArray(); // three full pages

    PageMemory memory;
    KvPagePool pool;
    Arena arena = Arena.ofConfined();

    void open(ProtectionLevel level) {
        memory = OffHeapPageMemory.allocate(G);
        pool = KvPagePool.create(PoolConfig.builder(G).level(level).sealer((PageSealerFactory) ctx -> new TestXorSealer(ctx.memory()))
                .build(), memory);
    }

    @AfterEach
    void close() {
        pool.close();
        memory.close();
        arena.close();
    }

    /** A request of {@code tenant} computes the prompt's KV, then finishes into the cache. */
    long[] computeAndCache(PrefixCache cache, int tenant, long request) {
        long[] h = new long[3];
        assertTrue(pool.allocate(tenant, Owners.request(request), LeaseKind.OWNER, 3, h, 0));
        for (long handle : h) {
            for (int b = 0; b < G.bufferCount(); b++) {
                pool.write(tenant, Owners.request(request), handle, b, 0, Patterns.fill(arena, G.pageBytes(b), tenant, 0, pool.view().pageOf(handle), b));
            }
        }
        assertEquals(3, cache.insert(tenant, request, PROMPT, h));
        return h;
    }

    int[] pages(long[] leases) {
        return java.util.Arrays.stream(leases).mapToInt(pool.view()::pageOf).toArray();
    }

    /** The cache namespace's lease on the page a (since handed over) lease names. */
    long namespaceLease(int scope, long lease) {
        return pool.view().leaseOf(pool.view().pageOf(lease), scope, Owners.namespace(0), LeaseKind.NAMESPACE);
    }

    boolean readsPrompt(int tenant, long request, long handle, int originalPage) {
        MemorySegment got = arena.allocate(G.pageBytes(0));
        pool.read(tenant, Owners.request(request), handle, 0, 0, got);
        return Patterns.matches(got, 0, 0, originalPage, 0);
    }

    @Test
    void sameTenantHitsAndAnotherTenantMissesTheSamePrompt() {
        open(ProtectionLevel.ZERO);
        PrefixCache cache = new PrefixCache(pool);
        int a = pool.tenants().register("a");
        int b = pool.tenants().register("b");
        long[] cached = computeAndCache(cache, a, 1);
        long[] out = new long[3];
        assertEquals(3, cache.match(a, 2, PROMPT, out), "same tenant, same prompt: a hit");
        assertArrayEquals(pages(cached), pages(out), "the cached pages, through the request's own reader leases");
        assertTrue(readsPrompt(a, 2, out[2], pool.view().pageOf(cached[2])), "the matching request reads the cached bytes");
        assertEquals(0, cache.match(b, 3, PROMPT, new long[3]), "another tenant never hits another tenant's prefix");
        assertEquals(1, cache.hits());
        assertEquals(1, cache.misses());
        int[] other = PROMPT.clone();
        other[5] = -1;
        assertEquals(1, cache.match(a, 4, other, new long[3]), "a different second page ends the match at page 1");
    }

    @Test
    void underZeroAnEvictedPrefixIsLost() {
        open(ProtectionLevel.ZERO);
        PrefixCache cache = new PrefixCache(pool);
        int a = pool.tenants().register("a");
        computeAndCache(cache, a, 1);
        assertEquals(3, cache.evict(3));
        pool.endStep();
        assertEquals(0, cache.match(a, 2, PROMPT, new long[3]));
        assertEquals(0, cache.size());
    }

    @Test
    void underEncryptAnEvictedPrefixIsReclaimedWithItsExactBytes() {
        open(ProtectionLevel.ENCRYPT);
        PrefixCache cache = new PrefixCache(pool);
        int a = pool.tenants().register("a");
        long[] cached = computeAndCache(cache, a, 1);
        assertEquals(3, cache.evict(3));
        pool.endStep();
        for (long h : cached) {
            assertEquals(a, pool.view().sealedFor(pool.view().pageOf(h)), "evicted pages are sealed for their tenant");
        }
        long[] out = new long[3];
        assertEquals(3, cache.match(a, 2, PROMPT, out));
        assertEquals(3, cache.reclaimHits());
        for (int i = 0; i < 3; i++) {
            assertTrue(readsPrompt(a, 2, out[i], pool.view().pageOf(cached[i])), "reclaimed page " + i + " holds the exact prompt KV");
        }
    }

    @Test
    void aRecomputedPageReplacesTheSealedReferenceOfItsBlock() {
        open(ProtectionLevel.ENCRYPT);
        PrefixCache cache = new PrefixCache(pool);
        int a = pool.tenants().register("a");
        computeAndCache(cache, a, 1);
        assertEquals(3, cache.evict(3));
        pool.endStep();
        long[] fresh = computeAndCache(cache, a, 2);
        assertEquals(0, cache.residentPages() - 3, "the recomputed pages are cached resident");
        long[] out = new long[3];
        assertEquals(3, cache.match(a, 3, PROMPT, out));
        assertArrayEquals(pages(fresh), pages(out));
        assertEquals(0, cache.reclaimHits(), "a resident page is served without a reclaim");
    }

    @Test
    void aReclaimAfterThePageWentToAnotherTenantIsGoneAndFallsBackToRecompute() {
        open(ProtectionLevel.ENCRYPT);
        PrefixCache cache = new PrefixCache(pool);
        int a = pool.tenants().register("a");
        int b = pool.tenants().register("b");
        computeAndCache(cache, a, 1);
        cache.evict(3);
        pool.endStep();
        long[] all = new long[G.usablePages()];
        assertTrue(pool.allocate(b, Owners.request(9), LeaseKind.OWNER, all.length, all, 0), "B takes every page, sealed ones zeroed");
        assertEquals(0, cache.match(a, 2, PROMPT, new long[3]), "gone: the engine recomputes");
        assertEquals(3, cache.reclaimGone(), "the matched run's three sealed blocks were all gone");
        assertEquals(0, cache.size());
        pool.release(b, Owners.request(9), all, 0, all.length, ReleaseReason.FINISHED);
    }

    @Test
    void theSharedNamespaceServesOrdinaryTenantsButNeverRegulatedOnes() {
        open(ProtectionLevel.ZERO);
        PrefixCache cache = new PrefixCache(pool);
        int pub = pool.tenants().register("public-system-prompt");
        int a = pool.tenants().register("a");
        int bank = pool.tenants().register("bank", TenantPolicy.regulatedTenant());
        cache.declareShared(pub);
        long[] shared = computeAndCache(cache, pub, 1);
        long[] out = new long[3];
        assertEquals(3, cache.match(a, 2, PROMPT, out));
        assertTrue(readsPrompt(a, 2, out[0], pool.view().pageOf(shared[0])));
        assertEquals(0, cache.match(bank, 3, PROMPT, new long[3]), "regulated tenants never share prefix pages");
        ForeignAccessException e = org.junit.jupiter.api.Assertions.assertThrows(ForeignAccessException.class,
                () -> Leases.addReader(pool, pub, Owners.namespace(0), namespaceLease(pub, shared[0]), bank, Owners.request(4)));
        assertTrue(e.getMessage().contains("regulated"), e.getMessage());
        cache.unmatch(a, 2, out, 3);
        assertEquals(3, cache.evict(3), "unmatched pages can be evicted");
    }
}
