package dev.kvshield.bridge.handoff;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.admission.RequestTooLongException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Reader claims of prefill sends grow chunk by chunk over exactly the pages each chunk hands the
 * transport (the request's own, another same-tenant request's, the cache namespace's, a shared
 * namespace's), keep released pages out of circulation until {@link PrefillSends#complete}, refuse
 * a chunk holding another tenant's page with nothing claimed, and survive an expiry (fenced, never
 * freed). The Python tests drive the same through SGLang's hooked mixin, with planted-bug twins and
 * bytes read back.
 */
class PrefillSendsTest {
    private static final int PAGE = 4;
    private static final int PAGES = 9;
    private static final long PEER = 5;
    private static final long REQUEST = 21;
    private static final long EARLIER = 20;

    private final ByteBuffer io = ByteBuffer.allocateDirect(PAGES * PAGE * 8).order(ByteOrder.nativeOrder());
    private final ByteBuffer plan = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());

    private SlotAllocator allocator(OffHeapPageMemory m) {
        PoolGeometry g = m.geometry();
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", "true"), g, m);
        a.bind(io, plan);
        return a;
    }

    private static OffHeapPageMemory memory() {
        return OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build());
    }

    /** Allocates tokens {@code [fromTokens, toTokens)} of {@code request} (page-aligned start); returns their page ids. */
    private int[] allocate(SlotAllocator a, long request, int tenant, int fromTokens, int toTokens) {
        plan.asLongBuffer().put(0, new long[] {request, tenant, fromTokens, toTokens, -1});
        int pages = (toTokens - fromTokens + PAGE - 1) / PAGE;
        assertEquals(pages * PAGE, a.alloc(pages * PAGE, 1, 0));
        int[] out = new int[pages];
        for (int i = 0; i < pages; i++) {
            out[i] = (int) (io.getLong(i * PAGE * 8) / PAGE);
        }
        return out;
    }

    /** SGLang's release of a request's pages (a free of their first slots in the request's release). */
    private void free(SlotAllocator a, int tenant, long request, int... pages) {
        for (int i = 0; i < pages.length; i++) {
            io.putLong(i * 8, (long) pages[i] * PAGE);
        }
        assertEquals(0, a.free(pages.length, tenant, request, request < 0 ? SlotAllocator.CACHE_EVICTION : 0));
    }

    private static int[] concat(int[]... parts) {
        return java.util.Arrays.stream(parts).flatMapToInt(java.util.Arrays::stream).toArray();
    }

    @Test
    void claimsGrowPerChunkAndHoldReleasedPagesUntilComplete() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] first = allocate(a, REQUEST, t, 0, 8);
            sends.begin(REQUEST, t, 10, PEER);
            assertEquals(2, sends.claim(REQUEST, first, 2));
            sends.markSent(REQUEST, 8);
            assertThrows(IllegalArgumentException.class, () -> sends.markSent(REQUEST, 10), "tokens beyond the claimed pages");
            int[] last = allocate(a, REQUEST, t, 8, 10);
            assertEquals(1, sends.claim(REQUEST, concat(last, last, first), 3), "pages already claimed are not claimed twice");
            assertEquals(0, sends.claim(REQUEST, last, 1));
            assertEquals(3, sends.claimedPages(REQUEST));
            sends.markSent(REQUEST, 10);
            long before = a.availablePages();
            free(a, t, REQUEST, first[0], first[1], last[0]);
            a.endStep();
            assertEquals(before, a.availablePages(), "released pages under reader claims must stay out of circulation");
            sends.complete(REQUEST);
            a.endStep();
            assertEquals(before + 3, a.availablePages());
            assertFalse(sends.has(REQUEST));
        }
    }

    @Test
    void prefixPagesOfTheTenantAreClaimedInTheirOwnersNameAndHeldWhenTheirOwnerLetsGo() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            KvPagePool pool = a.pool();
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] earlier = allocate(a, EARLIER, t, 0, 8); // a stock radix cache's hit: another request's pages
            int[] cached = allocate(a, EARLIER + 1, t, 0, 4);
            assertEquals(1, a.adoptIntoCache(EARLIER + 1, t, 0, -1, 0)); // SGLang's tree took the page
            int[] own = allocate(a, REQUEST, t, 12, 16);
            sends.begin(REQUEST, t, 16, PEER);
            assertEquals(4, sends.claim(REQUEST, concat(earlier, cached, own), 4));
            assertEquals(4, pool.snapshot().liveClaims());
            long before = a.availablePages();
            free(a, t, EARLIER, earlier); // the earlier request's pages are freed while the transport reads
            free(a, -1, -1, cached); // the tree evicts its page
            a.endStep();
            assertEquals(before, a.availablePages(), "released prefix pages under reader claims must stay out of circulation");
            sends.complete(REQUEST);
            a.endStep();
            assertEquals(before + 3, a.availablePages());
            assertEquals(0, pool.snapshot().claimedPages());
        }
    }

    @Test
    void anotherTenantsPageRefusesTheChunkNamingItAndNothingIsClaimed() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int other = a.tenantId("globex");
            int[] own = allocate(a, REQUEST, t, 0, 8);
            int[] foreign = allocate(a, EARLIER, other, 0, 4);
            sends.begin(REQUEST, t, 12, PEER);
            ForeignAccessException e = assertThrows(ForeignAccessException.class,
                    () -> sends.claim(REQUEST, concat(own, foreign), 3));
            assertTrue(e.getMessage().contains("request " + REQUEST) && e.getMessage().contains("page " + foreign[0])
                    && e.getMessage().contains("tenant " + other), e.getMessage());
            assertEquals(0, sends.claimedPages(REQUEST));
            assertEquals(0, a.pool().snapshot().claimedPages(), "a refused chunk claims nothing");
        }
    }

    @Test
    void aChunkOverSeveralOwnersIsClaimedAllOrNothingWhenClaimSlotsRunOut() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            KvPagePool pool = a.pool();
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] earlier = allocate(a, EARLIER, t, 0, 8);
            int[] own = allocate(a, REQUEST, t, 8, 12);
            int[] filler = allocate(a, REQUEST + 9, t, 0, 4);
            long[] fillerLease = {pool.view().leaseOf(filler[0], t, Owners.request(REQUEST + 9), LeaseKind.OWNER)};
            while (pool.snapshot().liveClaims() < 1022) { // NOTE: 1024 claim slots (the minimum); 2 left for the first run
                pool.claim(t, Owners.request(REQUEST + 9), fillerLease, 0, 1, ClaimKind.READER, PEER, new long[1], 0);
            }
            sends.begin(REQUEST, t, 12, PEER);
            assertThrows(LeaseCapacityException.class, () -> sends.claim(REQUEST, concat(earlier, own), 3));
            assertEquals(0, sends.claimedPages(REQUEST));
            assertEquals(1022, pool.snapshot().liveClaims(), "the first owner's claims must be dropped again");
        }
    }

    @Test
    void sharedNamespacePagesAreSentByUnregulatedTenantsOnly() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            KvPagePool pool = a.pool();
            PrefillSends sends = new PrefillSends(a);
            int shared = a.tenantId("public-prompt");
            int t = a.tenantId("acme");
            int regulated = pool.tenants().register("clinic", TenantPolicy.regulatedTenant());
            int[] prompt = allocate(a, EARLIER, shared, 0, 4);
            sends.begin(REQUEST, t, 8, PEER);
            assertThrows(ForeignAccessException.class, () -> sends.claim(REQUEST, prompt, 1), "not declared shared yet");
            pool.declareSharedNamespace(shared);
            assertEquals(1, sends.claim(REQUEST, prompt, 1));
            sends.begin(REQUEST + 1, regulated, 8, PEER);
            ForeignAccessException e = assertThrows(ForeignAccessException.class, () -> sends.claim(REQUEST + 1, prompt, 1));
            assertTrue(e.getMessage().contains("regulated"), e.getMessage());
            assertEquals(0, sends.claimedPages(REQUEST + 1));
        }
    }

    @Test
    void refusalsNameTheValuesAndClaimNothing() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            assertThrows(RequestTooLongException.class, () -> sends.begin(REQUEST, t, 33, PEER));
            assertFalse(sends.has(REQUEST), "an oversized request records nothing");
            int[] pages = allocate(a, REQUEST, t, 0, 8);
            sends.begin(REQUEST, t, 8, PEER);
            free(a, t, REQUEST, pages[1]);
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> sends.claim(REQUEST, pages, 2));
            assertTrue(e.getMessage().contains("page " + pages[1]) && e.getMessage().contains("not allocated"), e.getMessage());
            IllegalArgumentException outside = assertThrows(IllegalArgumentException.class,
                    () -> sends.claim(REQUEST, new int[] {pages[0], PAGES}, 2));
            assertTrue(outside.getMessage().contains("page " + PAGES), outside.getMessage());
            int[] more = allocate(a, REQUEST, t, 8, 16);
            assertThrows(IllegalArgumentException.class, () -> sends.claim(REQUEST, concat(new int[] {pages[0]}, more), 3),
                    "more pages than the request's tokens fill");
            assertEquals(0, sends.claimedPages(REQUEST));
            assertEquals(0, a.pool().snapshot().claimedPages());
            assertThrows(IllegalStateException.class, () -> sends.begin(REQUEST, t, 8, PEER));
        }
    }

    @Test
    void expiryFencesAndAlarmsButNeverFrees() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] pages = allocate(a, REQUEST, t, 0, 8);
            sends.begin(REQUEST, t, 8, PEER);
            sends.claim(REQUEST, pages, 2);
            sends.expire(REQUEST);
            sends.expire(REQUEST);
            assertEquals(1, sends.alarms().length);
            assertTrue(sends.alarms()[0].contains("request " + REQUEST) && sends.alarms()[0].contains("2 source pages"),
                    sends.alarms()[0]);
            assertThrows(IllegalStateException.class, () -> sends.claim(REQUEST, pages, 2));
            long before = a.availablePages();
            free(a, t, REQUEST, pages);
            a.endStep();
            assertEquals(before, a.availablePages(), "an expired send's pages must stay out of circulation");
            sends.complete(REQUEST);
            a.endStep();
            assertEquals(before + 2, a.availablePages());
            assertEquals(0, sends.active());
        }
    }
}
