package dev.kvshield.perf.simulate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.testing.SimFixtures;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.testing.TestXorSealer;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Test;

/**
 * Leak-oracle twins for the guards that need no handoff: each scenario is an engine bug that only
 * one guard stops. With the guard the oracle stays at zero and the request fails; with the guard
 * planted away (in this test code, never a switch in the pool) the oracle must fire.
 */
class GuardTwinsTest {
    static final PoolGeometry G = SimFixtures.tinyGeometry(8);
    static final int BPT = G.bytesPerToken(0);

    /** Tenant 0's request 1 fills four pages and finishes; tenant 1's request 2 gets the first of them back (LIFO) and writes one token. */
    private static long setUpPageTail(ServingPool pool, Arena arena) {
        pool.registerTenants(2);
        long[] victim = new long[4];
        pool.allocate(0, Owners.request(1), 4, victim, 0);
        MemorySegment[] page = perBuffer(arena, G, 4);
        for (int p = 0; p < 4; p++) {
            for (int b = 0; b < G.bufferCount(); b++) {
                Canary.fill(page[b], 0, 1, p * 4, 4, b, BPT);
            }
            pool.write(0, Owners.request(1), victim[p], 0, page);
        }
        pool.release(0, Owners.request(1), victim, 4, false);
        pool.endStep();
        long[] mine = new long[1];
        pool.allocate(1, Owners.request(2), 1, mine, 0);
        MemorySegment[] token = perBuffer(arena, G, 1);
        for (int b = 0; b < G.bufferCount(); b++) {
            Canary.fill(token[b], 1, 2, 0, 1, b, BPT);
        }
        pool.write(1, Owners.request(2), mine[0], 0, token);
        return mine[0];
    }

    /** One scratch segment of {@code tokens} slots per buffer of {@code geometry}. */
    private static MemorySegment[] perBuffer(Arena arena, PoolGeometry geometry, int tokens) {
        MemorySegment[] segments = new MemorySegment[geometry.bufferCount()];
        for (int b = 0; b < segments.length; b++) {
            segments[b] = arena.allocate((long) tokens * geometry.bytesPerToken(b));
        }
        return segments;
    }

    /** The attention kernel reads the whole last page (4 slots) although request 2 wrote one. */
    @Test
    void writtenExtentCheckOffLeaksThePreviousOwnersTail() {
        try (Arena arena = Arena.ofConfined(); OffHeapPageMemory memory = OffHeapPageMemory.allocate(G)) {
            MemorySegment[] wholePage = perBuffer(arena, G, 4);
            try (ServingPool pool = PoolFactory.synchronous(null).create(Level.NONE, memory)) {
                long h = setUpPageTail(pool, arena);
                assertThrows(ReadBeforeWriteException.class, () -> pool.read(1, Owners.request(2), h, 0, wholePage),
                        "the guard turns the tail read into a failed request");
                // Twin: the same read through raw memory, as if the written-extent check were off.
                LeakOracle oracle = new LeakOracle();
                memory.read(pool.pageOf(h), 0, 0, wholePage[0]);
                oracle.check(wholePage[0], 4, 0, BPT, 1, 2, 1, 2);
                assertEquals(3L * BPT, oracle.leakedBytes(), "three slots of tenant 0's KV");
                assertEquals(new LeakSample(0, 1, 1, 2, 1, 0), oracle.firstLeak());
            }
        }
    }

    @Test
    void stockServesThePreviousOwnersTail() {
        try (Arena arena = Arena.ofConfined(); OffHeapPageMemory memory = OffHeapPageMemory.allocate(G);
                ServingPool pool = new StockPool(memory)) {
            long h = setUpPageTail(pool, arena);
            MemorySegment[] wholePage = perBuffer(arena, G, 4);
            pool.read(1, Owners.request(2), h, 0, wholePage);
            LeakOracle oracle = new LeakOracle();
            oracle.check(wholePage[0], 4, 0, BPT, 1, 2, 1, 2);
            assertEquals(3L * BPT, oracle.leakedBytes());
        }
    }

    /**
     * ENCRYPT: tenant 0's prefix cache keeps a sealed reference to request 1's page; the page is
     * later handed to request 2 of the same tenant, released and sealed again. Reclaiming with the
     * old reference must answer "gone"; a handle view that re-stamps the reference with the page's
     * current generation (generation not bumped) reclaims request 2's KV as request 1's prefix.
     */
    @Test
    void generationNotBumpedReclaimsAnotherRequestsSealedPage() {
        PoolGeometry one = SimFixtures.tinyGeometry(2);
        try (Arena arena = Arena.ofConfined(); OffHeapPageMemory memory = OffHeapPageMemory.allocate(one);
                ServingPool pool = PoolFactory.synchronous(ctx -> new TestXorSealer(ctx.memory())).create(Level.ENCRYPT, memory)) {
            KvPagePool kv = ((ShieldedPool) pool).pool();
            pool.registerTenants(1);
            MemorySegment[] page = perBuffer(arena, one, 4);
            long[] h = new long[1];
            long stale = 0;
            for (long request = 1; request <= 2; request++) {
                pool.allocate(0, Owners.request(request), 1, h, 0);
                for (int b = 0; b < one.bufferCount(); b++) {
                    Canary.fill(page[b], 0, request, 0, 4, b, BPT);
                }
                pool.write(0, Owners.request(request), h[0], 0, page);
                if (request == 1) {
                    // The only page goes to request 2 next; tenant 0's prefix cache keeps request 1's reference.
                    stale = PageHandles.sealedReference(kv.view().handleOf(h[0]));
                }
                pool.release(0, Owners.request(request), h, 1, false);
                pool.endStep();
            }
            long owner = Owners.request(3);
            long[] out = new long[1];
            assertEquals(0, kv.reclaim(0, owner, LeaseKind.OWNER, new long[] {stale}, 0, 1, out, 0), "a stale sealed reference is gone");
            // Twin: re-stamp the reference with the page's current generation.
            int p = PageHandles.page(stale);
            long restamped = PageHandles.encode(p, kv.view().generationOf(p));
            assertEquals(1, kv.reclaim(0, owner, LeaseKind.OWNER, new long[] {restamped}, 0, 1, out, 0));
            LeakOracle oracle = new LeakOracle();
            pool.read(0, owner, out[0], 0, page);
            for (int b = 0; b < one.bufferCount(); b++) {
                oracle.check(page[b], 4, b, BPT, 0, 3, 0, 1);
            }
            assertTrue(oracle.leakedBytes() > 0, "request 2's KV served as request 1's prefix");
            assertEquals(2, oracle.firstLeak().fromRequest());
            pool.release(0, owner, out, 1, false);
        }
    }
}
