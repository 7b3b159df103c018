package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestXorSealer;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The ENCRYPT pipeline of the pool (sealed state, reclaim, hand-out zeroing, eviction order, shred)
 * with a test sealer: an XOR keystream from a seeded generator per (tenant, page, generation,
 * buffer). The real cipher lives in tenant-keys; this pins what the pool does around it.
 */
class EncryptPipelineTest {
    static final PoolGeometry G = PoolGeometry.builder().mha(2, 1, 8, 2).pageSizeTokens(4).pageCount(5).build();

    private KvPagePool pool(PageMemory memory, List<PageEventType> events) {
        return KvPagePool.create(PoolConfig.builder(G).level(ProtectionLevel.ENCRYPT)
                .sealer((PageSealerFactory) ctx -> new TestXorSealer(ctx.memory()))
                .listener((type, page, gen, tenant, owner, detail) -> events.add(type)).build(), memory);
    }

    private static void writeAll(KvPagePool pool, Arena arena, int tenant, long request, long[] handles) {
        for (long h : handles) {
            for (int b = 0; b < G.bufferCount(); b++) {
                pool.write(tenant, Owners.request(request), h, b, 0, Patterns.fill(arena, G.pageBytes(b), tenant, request, pool.view().pageOf(h), b));
            }
        }
    }

    @Test
    void sealedPagesHoldNoPlaintextAndReclaimReturnsItExactly() {
        List<PageEventType> events = new ArrayList<>();
        try (PageMemory memory = OffHeapPageMemory.allocate(G); KvPagePool pool = pool(memory, events); Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            long[] handles = Leases.handles(pool, h);
            writeAll(pool, arena, a, 1, h);
            pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            for (long handle : h) {
                int page = pool.view().pageOf(handle);
                assertEquals(PageState.SEALED, pool.view().stateOf(page));
                assertEquals(a, pool.view().sealedFor(page));
                assertFalse(PoolProbe.holdsPattern(memory, arena, page, a, 1), "plaintext survived sealing");
            }
            long[] refs = {PageHandles.sealedReference(handles[1]), PageHandles.sealedReference(handles[0])};
            long[] back = new long[2];
            assertEquals(2, pool.reclaim(a, Owners.request(2), LeaseKind.OWNER, refs, 0, 2, back, 0));
            for (int i = 0; i < 2; i++) {
                assertEquals(PageHandles.page(refs[i]), pool.view().pageOf(back[i]));
                assertTrue(PoolProbe.holdsPattern(memory, arena, pool.view().pageOf(back[i]), a, 1), "reclaim returns the exact plaintext");
                assertTrue(pool.view().isWritten(back[i], 0, G.pageSizeTokens()), "the reclaimed prefix stays readable");
            }
            assertEquals(2.0, pool.metrics().reclaimCount(true));
            assertTrue(events.contains(PageEventType.SEAL) && events.contains(PageEventType.RECLAIM));
        }
    }

    @Test
    void anotherTenantGetsSealedPagesZeroedAndOnlyAfterCleanOnesOldestFirst() {
        List<PageEventType> events = new ArrayList<>();
        try (PageMemory memory = OffHeapPageMemory.allocate(G); KvPagePool pool = pool(memory, events); Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[3];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0));
            long[] handles = Leases.handles(pool, h);
            writeAll(pool, arena, a, 1, h);
            pool.release(a, Owners.request(1), new long[] {h[1]}, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            pool.release(a, Owners.request(1), new long[] {h[0], h[2]}, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(4, pool.available(), "sealed pages count as available");
            long[] hb = new long[3];
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 3, hb, 0));
            assertArrayEquals(new int[] {4, 2, 1}, PoolScenarioTest.pages(pool, hb), "clean page 4 first, then sealed pages oldest first");
            for (long handle : hb) {
                assertTrue(Patterns.allZero(PoolProbe.rawPage(memory, arena, pool.view().pageOf(handle))), "zeroed at hand-out");
            }
            long[] gone = new long[1];
            assertEquals(0, pool.reclaim(a, Owners.request(3), LeaseKind.OWNER, new long[] {PageHandles.sealedReference(handles[1])}, 0, 1, gone, 0));
            assertEquals(PageHandles.NONE, gone[0], "reclaim after reuse answers gone");
        }
    }

    @Test
    void plantedBugHandOutWithoutZeroingWouldGiveCiphertext() {
        // Twin of the hand-out check: the same sealed page read raw before hand-out is non-zero noise.
        List<PageEventType> events = new ArrayList<>();
        try (PageMemory memory = OffHeapPageMemory.allocate(G); KvPagePool pool = pool(memory, events); Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            writeAll(pool, arena, a, 1, h);
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertFalse(Patterns.allZero(PoolProbe.rawPage(memory, arena, pool.view().pageOf(h[0]))),
                    "a hand-out that skipped zeroing would give the next owner this ciphertext");
        }
    }

    @Test
    void crossTenantAndStaleReclaimsAnswerGoneAndAreCounted() {
        List<PageEventType> events = new ArrayList<>();
        try (PageMemory memory = OffHeapPageMemory.allocate(G); KvPagePool pool = pool(memory, events); Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            long[] handles = Leases.handles(pool, h);
            writeAll(pool, arena, a, 1, h);
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            long ref = PageHandles.sealedReference(handles[0]);
            long[] out = new long[1];
            assertEquals(0, pool.reclaim(b, Owners.request(2), LeaseKind.OWNER, new long[] {ref}, 0, 1, out, 0));
            assertEquals(1.0, pool.metrics().rejections(Rejection.FOREIGN));
            assertEquals(0, pool.reclaim(a, Owners.request(2), LeaseKind.OWNER, new long[] {handles[0]}, 0, 1, out, 0), "the pre-release handle is stale");
            assertEquals(1.0, pool.metrics().rejections(Rejection.STALE));
            assertFalse(PoolProbe.holdsPattern(memory, arena, pool.view().pageOf(h[0]), a, 1), "no plaintext produced");
            assertEquals(1, pool.reclaim(a, Owners.request(2), LeaseKind.OWNER, new long[] {ref}, 0, 1, out, 0), "the owner still can");
        }
    }

    @Test
    void shreddingMakesEverySealedPageOfTheTenantUnrecoverableAndReportsEach() {
        List<PageEventType> events = new ArrayList<>();
        try (PageMemory memory = OffHeapPageMemory.allocate(G); KvPagePool pool = pool(memory, events); Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] ha = new long[2];
            long[] hb = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, ha, 0));
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
            long[] handlesA = Leases.handles(pool, ha);
            long[] handlesB = Leases.handles(pool, hb);
            writeAll(pool, arena, a, 1, ha);
            writeAll(pool, arena, b, 2, hb);
            pool.release(a, Owners.request(1), ha, 0, 2, ReleaseReason.FINISHED);
            pool.release(b, Owners.request(2), hb, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(2, pool.shredTenant(a));
            assertEquals(2, events.stream().filter(e -> e == PageEventType.SHRED).count());
            long[] out = new long[2];
            assertEquals(0, pool.reclaim(a, Owners.request(3), LeaseKind.OWNER, new long[] {PageHandles.sealedReference(handlesA[0]),
                    PageHandles.sealedReference(handlesA[1])}, 0, 2, out, 0));
            assertEquals(1, pool.reclaim(b, Owners.request(3), LeaseKind.OWNER, new long[] {PageHandles.sealedReference(handlesB[0])}, 0, 1, out, 0),
                    "other tenants keep their sealed pages");
            // After shredding, the tenant's new releases are zeroed instead of sealed.
            long[] again = new long[1];
            assertTrue(pool.allocate(a, Owners.request(4), LeaseKind.OWNER, 1, again, 0));
            writeAll(pool, arena, a, 4, again);
            pool.release(a, Owners.request(4), again, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(pool.view().pageOf(again[0])));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(memory, arena, pool.view().pageOf(again[0]))));
        }
    }

    @Test
    void encryptWithoutAKeySourceFailsNamingTheFix() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> PoolConfig.builder(G).level(ProtectionLevel.ENCRYPT).build());
        assertTrue(e.getMessage().contains("ENCRYPT needs a key source"), e.getMessage());
        try (PageMemory memory = OffHeapPageMemory.allocate(G);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(G).level(ProtectionLevel.ZERO).build(), memory)) {
            IllegalArgumentException t = assertThrows(IllegalArgumentException.class,
                    () -> pool.tenants().register("x", TenantPolicy.withLevel(ProtectionLevel.ENCRYPT)));
            assertTrue(t.getMessage().contains("tenant 'x'") && t.getMessage().contains("key source"), t.getMessage());
            assertEquals(0, pool.tenants().size());
        }
    }
}
