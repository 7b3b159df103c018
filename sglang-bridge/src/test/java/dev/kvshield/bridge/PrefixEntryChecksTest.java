package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.bridge.prefix.PrefixCacheBridge;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The prefix cache's entry points (adopt, settle, reclaim) check every page and argument before changing anything:
 * a negative {@code toPos}, another tenant's settle and a short {@code pagesOut} are refused with the books unchanged.
 */
class PrefixEntryChecksTest extends SmallPoolFixture {
    /**
     * Promise (adoptIntoCache javadoc: "{@code toPos} -1: every position from fromPos"; IAE "needs ... 0 <= from <= to
     * (or to = -1)"): any negative toPos (here -5, e.g. a caller's unset or wrapped value) is taken as "every position",
     * so the request's whole page list from fromPos moves to the ENGINE_CACHE namespace, where only a CACHE_EVICTION free
     * can release it, instead of the call throwing with nothing changed.
     */
    @Test
    void adoptIntoCacheTakesANegativeToPosAsEveryPosition() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        long digest = a.pool().stateDigest();
        assertThrows(IllegalArgumentException.class, () -> a.adoptIntoCache(5, t, 0, -5, 0));
        assertEquals(2, a.heldPages(5));
        assertEquals(digest, a.pool().stateDigest());
    }

    /**
     * Promise (PrefixCacheBridge class javadoc: "Every call checks all its pages before changing anything and fails with
     * an exception naming the offending value"; settle: "positions [toPage, releaseToPage) ... are released where the
     * request still holds them"; SlotAllocator.releaseAll: clear() releases every page a request holds): settle with a
     * wrong tenant for the tail (here the whole range is tail) releases nothing, because the tenant does not hold the
     * pages, but still calls {@code forgetPage} on every page it walked. Request 7 of alpha keeps its three owner holds
     * while the allocator's page list forgets them: its releaseLeftovers then releases nothing and even releaseAll (whose
     * lookup goes through the page lists) leaves the three pages held forever.
     */
    @Test
    void settleWithTheWrongTenantDropsAnotherTenantsPagesFromTheBooks() {
        SlotAllocator a = allocator(4);
        int alpha = a.tenantId("alpha");
        int bravo = a.tenantId("bravo");
        PrefixCacheBridge cache = new PrefixCacheBridge(a);
        long before = a.availablePages();
        row(0, 7, alpha, 0, 12, -1);
        assertEquals(12, a.allocExtend(1, 12, 0));
        try {
            cache.settle(7, bravo, 0, 0, 3, new byte[0], new int[0]);
        } catch (IllegalArgumentException refused) {
            // fine: refused naming the value
        }
        int listed = a.heldPages(7);
        a.releaseAll();
        assertEquals(before, a.availablePages(), "pages leaked through clear() (request 7's list now names " + listed + " pages)");
        assertEquals(3, listed, "alpha's request 7 lost its page list to bravo's settle");
    }

    /**
     * Promise (PrefixCacheBridge class javadoc: "Every call checks all its pages before changing anything and fails with
     * an exception naming the offending value"; brief: nothing half-applied): reclaim checks neither {@code pagesOut}'s
     * length nor anything else before {@code pool.reclaim}. With a pagesOut one entry short, both sealed references are
     * reclaimed into the cache namespace (two pages OWNED, availability down by two, the references consumed: a second
     * reclaim gets 0), then an ArrayIndexOutOfBoundsException: the caller never learns the second page's id, so its tree
     * cannot evict it, and the page is held for good.
     */
    @Test
    void prefixReclaimWithAShortPagesOutReclaimsThenThrows() {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(4).pageCount(PAGES).build());
        try (SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "level", "ENCRYPT", "sealerFactory",
                XorTestSealerFactory.class.getName()), memory.geometry(), memory)) {
            SlotAllocators.bind(a);
            int t = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            SlotAllocators.allocate(a, 9, t, 8);
            int[] taken = new int[2];
            assertEquals(2, cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, taken));
            long[] sealed = new long[2];
            assertEquals(2, cache.evict(taken, 2, sealed));
            a.endStep();
            long available = a.availablePages();
            long digest = a.pool().stateDigest();
            RuntimeException e = assertThrows(RuntimeException.class, () -> cache.reclaim(t, sealed, 2, new int[1]));
            assertEquals(available, a.availablePages(), "reclaimed before failing with " + e);
            assertEquals(digest, a.pool().stateDigest());
            assertEquals(IllegalArgumentException.class, e.getClass());
        }
    }
}
