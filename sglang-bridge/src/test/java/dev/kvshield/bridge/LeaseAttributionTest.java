package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Every free the bridge applies is presented as the freer's own leases: a stale free of a finished
 * request's slots can never release the pages another tenant's running request holds now, and a
 * step's rows are allocated all or nothing. Each oracle reads the bytes the next owner sees.
 */
class LeaseAttributionTest {
    private static final int PAGE = 4;
    private static final int PAGES = 9;
    private static final byte A_BYTE = 0x5A;
    private static final byte B_BYTE = 0x3B;

    private final OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry());
    private final ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * PAGE * 8).order(ByteOrder.nativeOrder());
    private final ByteBuffer planBytes = ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
    private final LongBuffer io = ioBytes.asLongBuffer();
    private final LongBuffer plan = planBytes.asLongBuffer();

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build();
    }

    @AfterEach
    void close() {
        memory.close();
    }

    private SlotAllocator allocator() {
        return allocator(Map.of("advertisedContextTokens", "16"));
    }

    private SlotAllocator allocator(Map<String, String> settings) {
        SlotAllocator a = SlotAllocator.create(settings, geometry(), memory);
        a.bind(ioBytes, planBytes);
        return a;
    }

    /** Allocates {@code tokens} for a request from position 0 and fills its pages with {@code fill}; returns the pages. */
    private int[] allocateAndFill(SlotAllocator a, long request, int tenant, int tokens, byte fill) {
        plan.put(0, new long[] {request, tenant, 0, tokens, -1});
        assertEquals(tokens, a.allocExtend(1, tokens, 0));
        int[] pages = new int[(tokens + PAGE - 1) / PAGE];
        for (int i = 0; i < pages.length; i++) {
            pages[i] = (int) (io.get(i * PAGE) / PAGE);
            for (int b = 0; b < geometry().bufferCount(); b++) {
                memory.hostRegion(pages[i], b).fill(fill);
            }
        }
        return pages;
    }

    private boolean holds(int page, byte fill) {
        for (int b = 0; b < geometry().bufferCount(); b++) {
            for (byte x : memory.hostRegion(page, b).toArray(ValueLayout.JAVA_BYTE)) {
                if (x != fill) {
                    return false;
                }
            }
        }
        return true;
    }

    private void putSlotsOf(int... pages) {
        for (int i = 0; i < pages.length; i++) {
            for (int k = 0; k < PAGE; k++) {
                io.put(i * PAGE + k, (long) pages[i] * PAGE + k);
            }
        }
    }

    /**
     * A finishes and frees; B (another tenant) gets A's pages and runs; a stale free of A's slots
     * arrives. Returns B's pages, then the pages a third request C gets next, so the oracle can see
     * whether B's pages were handed on while B still runs.
     */
    private int[][] staleFreeThenNextAllocation(SlotAllocator a, boolean presentCurrentHold) {
        int t1 = a.tenantId("acme");
        int t2 = a.tenantId("globex");
        int[] pagesA = allocateAndFill(a, 1, t1, 8, A_BYTE);
        assertEquals(0, a.freeSegment(1, 0, 8, t1, 0));
        a.endStep();
        int[] pagesB = allocateAndFill(a, 2, t2, 8, B_BYTE);
        assertArrayEquals(pagesA, pagesB, "LIFO reuse gives B exactly A's pages: the stale free names B's pages");
        putSlotsOf(pagesA);
        if (presentCurrentHold) {
            // Planted bug: free the slots' pages as whoever holds them now (what freeing bare ids did).
            long[] current = new long[pagesA.length];
            for (int i = 0; i < pagesA.length; i++) {
                current[i] = a.pool().view().primaryLeaseOf(pagesA[i]);
            }
            a.pool().release(a.pool().view().tenantOfLease(current[0]), a.pool().view().holderOf(current[0]), current, 0,
                    current.length, ReleaseReason.FINISHED);
        } else {
            assertEquals(2, a.free(8, t1, 1, 0), "the stale free in A's release is refused page by page");
            assertEquals(2, a.free(8, -1, -1, 0), "and as a bare free outside any release");
        }
        a.endStep();
        int other = a.tenantId("initech");
        int free = a.availablePages();
        return new int[][] {pagesB, allocateAndFill(a, 3, other, free * PAGE, (byte) 0x11)};
    }

    @Test
    void aStaleFreeOfAFinishedRequestsSlotsNeverReachesTheRunningRequestOfAnotherTenant() {
        try (SlotAllocator a = allocator()) {
            int[][] seen = staleFreeThenNextAllocation(a, false);
            int[] next = seen[1];
            for (int page : seen[0]) {
                assertEquals(page, a.pageAt(2, page == seen[0][0] ? 0 : 1), "B still holds its pages");
                assertEquals(PageState.OWNED, a.pool().view().stateOf(page));
                assertEquals(a.tenantId("globex"), a.tenantOf(page));
                assertTrue(holds(page, B_BYTE), "B's KV is untouched under B");
                for (int n : next) {
                    assertNotEquals(page, n, "no other request gets a page B still runs on");
                }
            }
            assertEquals(4, a.rejectedFrees());
            assertTrue(a.lastRejection().contains("OWNED by tenant " + a.tenantId("globex")), a.lastRejection());
        }
    }

    @Test
    void plantedBugFreeingAsThePagesCurrentHolderHandsTheRunningRequestsPagesOn() {
        try (SlotAllocator a = allocator()) {
            int[][] seen = staleFreeThenNextAllocation(a, true);
            boolean handedOn = false;
            for (int page : seen[0]) {
                for (int n : seen[1]) {
                    handedOn |= n == page;
                }
            }
            assertTrue(handedOn, "twin: a free by bare page ids gives a third request the pages B is still running on");
        }
    }

    @Test
    void theCachesEvictionInsideAFreeGroupWaitsForTheGroupsEnd() {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            int[] pages = allocateAndFill(a, 5, t, 8, A_BYTE);
            assertEquals(2, a.adoptIntoCache(5, t, 0, -1, 0), "the tree took both pages");
            for (int i = 0; i < PAGE; i++) {
                io.put(i, (long) pages[0] * PAGE + i);
            }
            assertEquals(0, a.free(PAGE, -1, -1, SlotAllocator.CACHE_EVICTION | SlotAllocator.IN_FREE_GROUP));
            assertEquals(1, a.pendingGroupPages());
            assertEquals(0, a.pendingRequestPages(5, t), "the cache's eviction is no request's free");
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[0]), "an eviction in a group waits for its end");
            assertEquals(1, a.endFreeGroup(0));
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(pages[0]));
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[1]), "the other page stays the cache's");
            assertEquals(0, a.rejectedFrees());
        }
    }

    @Test
    void thePoolsOwnHolderIdsAreNoRequests() {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            long reserved = (1L << 62) - 2;
            plan.put(0, new long[] {reserved, t, 0, PAGE, -1});
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> a.allocExtend(1, PAGE, 0));
            assertTrue(e.getMessage().contains("request=" + reserved), e.getMessage());
            int[] pages = allocateAndFill(a, 5, t, PAGE, A_BYTE);
            io.put(0, (long) pages[0] * PAGE);
            assertThrows(IllegalArgumentException.class, () -> a.free(1, t, reserved, 0));
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[0]));
        }
    }

    @Test
    void freesInsideAFreeGroupWaitForTheGroupsEndAndNeverJoinTheCache() {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            int[] pages = allocateAndFill(a, 5, t, 12, A_BYTE);
            assertEquals(0, a.freeSegment(5, 8, 4, t, SlotAllocator.IN_FREE_GROUP)); // the tail, inside the group
            assertEquals(1, a.pendingGroupPages());
            assertEquals(1, a.pendingRequestPages(5, t), "the grouped free is request 5's");
            assertEquals(0, a.pendingRequestPages(6, t));
            assertEquals(0, a.pendingRequestPages(5, a.tenantId("globex")));
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[2]), "a grouped free waits for the group's end");
            assertEquals(-1, a.pageAt(5, 2), "it left the request's page list at once");
            assertEquals(2, a.adoptIntoCache(5, t, 0, -1, 0), "the tree takes what the request still holds, not the grouped free");
            assertEquals(1, a.endFreeGroup(0));
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(pages[2]));
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[0]));
            assertTrue(a.pool().view().leaseOf(pages[0], t, SlotAllocator.ENGINE_CACHE, LeaseKind.NAMESPACE) != LeaseIds.NONE);
        }
    }

    @Test
    void adoptedPagesAreFreedOnlyAsTheCachesAndLeftoversAreReleased() {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            int[] cached = allocateAndFill(a, 6, t, 8, A_BYTE);
            assertEquals(2, a.adoptIntoCache(6, t, 0, -1, 0));
            putSlotsOf(cached);
            assertEquals(2, a.free(8, t, 6, 0), "the request no longer holds what the tree took");
            assertEquals(PageState.OWNED, a.pool().view().stateOf(cached[0]));
            putSlotsOf(cached[0]);
            assertEquals(1, a.free(PAGE, -1, -1, 0), "a bare free outside the tree's eviction cannot present the cache's holds");
            assertEquals(PageState.OWNED, a.pool().view().stateOf(cached[0]));
            assertEquals(0, a.free(PAGE, -1, -1, SlotAllocator.CACHE_EVICTION), "the tree's eviction frees as the cache");
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(cached[0]));
            int[] left = allocateAndFill(a, 7, t, 8, A_BYTE);
            assertEquals(2, a.heldPages(7));
            assertEquals(2, a.releaseLeftovers(7, t, 0));
            assertEquals(0, a.heldPages(7));
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(left[1]));
        }
    }

    /** Two rows, the second over its tenant's quota; {@code rowByRow} plants the old per-row allocation. */
    private long[] digestsAroundAQuotaFailure(boolean rowByRow) {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            int capped = a.pool().tenants().register("capped", TenantPolicy.withQuota(1));
            long before = a.pool().stateDigest();
            if (rowByRow) {
                long[] out = new long[2];
                a.pool().allocate(t, Owners.request(1), LeaseKind.OWNER, 2, out, 0);
                a.pool().allocate(capped, Owners.request(2), LeaseKind.OWNER, 2, out, 0);
            } else {
                plan.put(0, new long[] {1, t, 0, 8, -1});
                plan.put(SlotAllocator.PLAN_ROW, new long[] {2, capped, 0, 8, -1});
                assertEquals(-1, a.allocExtend(2, 16, 0), "one row over quota: the step gets nothing");
            }
            return new long[] {before, a.pool().stateDigest()};
        }
    }

    @Test
    void aStepsRowsAreAllocatedAllOrNothing() {
        long[] d = digestsAroundAQuotaFailure(false);
        assertEquals(d[0], d[1]);
        long[] twin = digestsAroundAQuotaFailure(true);
        assertFalse(twin[0] == twin[1], "twin: allocating row by row keeps the first row when the second fails");
    }

    /**
     * Inside its release, request 8 frees (stale slots) a page it holds, and its tree cache then keeps
     * that page: the free is withdrawn and the page stays the cache's, so a next request of another
     * tenant never gets a page the tree still hands out as a prefix. Returns whether the third
     * request's pages exclude the cached page and the cached page still holds its bytes.
     */
    private boolean cachedPageSurvivesAStaleSelfFree(boolean adoptBeforeFreesEnd) {
        try (SlotAllocator a = allocator()) {
            int acme = a.tenantId("acme");
            int globex = a.tenantId("globex");
            int[] pages = allocateAndFill(a, 8, acme, 8, A_BYTE);
            putSlotsOf(pages[0]);
            assertEquals(0, a.free(PAGE, acme, 8, SlotAllocator.IN_FREE_GROUP), "its own page: a deferred free");
            putSlotsOf(pages);
            if (adoptBeforeFreesEnd) {
                assertEquals(1, a.adoptSlots(2 * PAGE, acme, 8, 0), "the withdrawn free is counted");
                assertEquals(0, a.endRequestFrees(8, acme, 0));
            } else { // twin: the frees end before the tree's adoption is known
                assertEquals(1, a.endRequestFrees(8, acme, 0));
                a.adoptSlots(2 * PAGE, acme, 8, 0);
            }
            a.endStep();
            int[] next = allocateAndFill(a, 9, globex, 4 * PAGE, B_BYTE);
            boolean handedOn = java.util.Arrays.stream(next).anyMatch(p -> p == pages[0]);
            return !handedOn && a.pool().view().leaseOf(pages[0], acme, SlotAllocator.ENGINE_CACHE, LeaseKind.NAMESPACE)
                    != LeaseIds.NONE && holds(pages[0], A_BYTE);
        }
    }

    @Test
    void aStaleFreeOfAPageTheTreeKeepsIsWithdrawn() {
        assertTrue(cachedPageSurvivesAStaleSelfFree(true));
        assertFalse(cachedPageSurvivesAStaleSelfFree(false),
                "twin: releasing the request's frees before the tree's adoption hands the cached page to another tenant");
    }

    @Test
    void endRequestFreesReleasesOnlyThatRequestsDeferredFrees() {
        try (SlotAllocator a = allocator()) {
            int t = a.tenantId("acme");
            int[] first = allocateAndFill(a, 10, t, 4, A_BYTE);
            int[] second = allocateAndFill(a, 11, t, 4, B_BYTE);
            putSlotsOf(first);
            assertEquals(0, a.free(PAGE, t, 10, SlotAllocator.IN_FREE_GROUP));
            putSlotsOf(second);
            assertEquals(0, a.free(PAGE, t, 11, SlotAllocator.IN_FREE_GROUP));
            assertEquals(1, a.endRequestFrees(10, t, 0));
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(first[0]));
            assertEquals(PageState.OWNED, a.pool().view().stateOf(second[0]));
            assertEquals(1, a.pendingGroupPages());
            assertEquals(1, a.endFreeGroup(0));
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(second[0]));
        }
    }

    /**
     * A request's release in one call ({@code releaseRequest}) against the same release as three
     * calls (deferred free, end of the request's frees, leftovers): a free naming one of its pages
     * and another request's page. Returns {states of its freed page, its leftover page, the other
     * request's page; refusals}, and checks the other request's bytes survive.
     */
    private long[] releaseOfOwnAndForeignPage(boolean fused) {
        try (SlotAllocator a = allocator()) {
            int acme = a.tenantId("acme");
            int globex = a.tenantId("globex");
            int[] own = allocateAndFill(a, 20, acme, 2 * PAGE, A_BYTE);
            int[] other = allocateAndFill(a, 21, globex, PAGE, B_BYTE);
            putSlotsOf(own[0], other[0]);
            long refused;
            if (fused) {
                refused = a.releaseRequest(2 * PAGE, acme, 20, true, SlotAllocator.IN_FREE_GROUP);
            } else {
                refused = a.free(2 * PAGE, acme, 20, SlotAllocator.IN_FREE_GROUP);
                a.endRequestFrees(20, acme, 0);
                a.releaseLeftovers(20, acme, 0);
            }
            assertTrue(holds(other[0], B_BYTE), "the other request's page keeps its bytes");
            return new long[] {a.pool().view().stateOf(own[0]).ordinal(), a.pool().view().stateOf(own[1]).ordinal(),
                a.pool().view().stateOf(other[0]).ordinal(), refused, a.rejectedFrees(), a.heldPages(20), a.pendingGroupPages()};
        }
    }

    @Test
    void aReleaseInOneCallEndsAsItsThreeCallsDo() {
        long[] fused = releaseOfOwnAndForeignPage(true);
        assertArrayEquals(releaseOfOwnAndForeignPage(false), fused);
        assertArrayEquals(new long[] {PageState.QUARANTINED.ordinal(), PageState.QUARANTINED.ordinal(), PageState.OWNED.ordinal(),
            1, 1, 0, 0}, fused);
    }

    @Test
    void aStrictRefusalInAOneCallReleaseStillEndsTheRequestsEarlierFrees() {
        try (SlotAllocator a = allocator(Map.of("advertisedContextTokens", "16", "strict", "true"))) {
            int t = a.tenantId("acme");
            int[] pages = allocateAndFill(a, 30, t, 2 * PAGE, A_BYTE);
            putSlotsOf(pages[0]);
            assertEquals(0, a.free(PAGE, t, 30, SlotAllocator.IN_FREE_GROUP), "an earlier deferred free of the release");
            putSlotsOf(pages[0], pages[1]);
            // NOTE: IN_FREE_GROUP, as the plug-in's release passes it: the earlier deferred free is this release's
            assertThrows(ForeignAccessException.class, () -> a.releaseRequest(2 * PAGE, t, 30, true, SlotAllocator.IN_FREE_GROUP),
                    "page 0 freed twice in one release");
            assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(pages[0]), "the earlier free ended with the release");
            assertEquals(PageState.OWNED, a.pool().view().stateOf(pages[1]), "nothing of the refused free released, no leftovers");
            assertEquals(0, a.pendingGroupPages());
            assertTrue(holds(pages[1], A_BYTE));
        }
    }
}
