package dev.kvshield.bridge.prefix;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.bridge.SlotAllocators;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The bridge keeps the {@link SlotAllocator}'s page table equal to the pool while it takes a
 * request's pages into the cache namespace, releases duplicates and tails, adds lock holders as
 * readers and evicts; bad page ids change nothing. The byte-level scenarios (reclaim, gone,
 * tenant scope) with planted twins are in the Python tests, driven through SGLang's contract.
 */
class PrefixCacheBridgeTest {
    private static final int PAGE = 4;
    private static final int PAGES = 9;

    private static SlotAllocator allocator(OffHeapPageMemory m) {
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", "true"), geometry(), m);
        SlotAllocators.bind(a);
        return a;
    }

    private static boolean owned(SlotAllocator a, int page) {
        return a.pool().view().stateOf(page) == dev.kvshield.lifecycle.PageState.OWNED;
    }

    /** What a test does with a fresh allocator, its bridge, tenant acme and request 9's pages. */
    private interface Scenario {
        void run(SlotAllocator a, PrefixCacheBridge cache, int t, int[] pages);
    }

    /** Runs {@code body} on a fresh allocator where request 9 of tenant acme holds pages for {@code tokens}. */
    private static void withRequest(int tokens, Scenario body) {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m)) {
            int t = a.tenantId("acme");
            body.run(a, new PrefixCacheBridge(a), t, SlotAllocators.allocate(a, 9, t, tokens));
        }
    }

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build();
    }

    @Test
    void settleTakesReleasesDuplicatesAndTailsAndEvictsInStep() {
        withRequest(10, (a, cache, t, pages) -> { // two full pages and a partial one
            int[] taken = new int[2];
            assertEquals(1, cache.settle(9, t, 0, 2, 3, new byte[] {1, 0}, taken));
            assertArrayEquals(new int[] {pages[0], pages[1]}, taken);
            assertEquals(-1, a.requestOf(pages[0]), "a cached page belongs to the cache namespace, not the request");
            assertEquals(t, a.tenantOf(pages[0]));
            assertFalse(owned(a, pages[1]), "the duplicate goes back to the pool");
            assertFalse(owned(a, pages[2]), "the unaligned tail goes back to the pool");

            cache.addReaders(t, t, 11, new int[] {pages[0]}, 1);
            cache.removeReaders(t, t, 11, new int[] {pages[0]}, 1);
            int other = a.tenantId("other");
            assertThrows(RuntimeException.class, () -> cache.addReaders(t, other, 12, new int[] {pages[0]}, 1),
                    "another tenant never reads a page that is not shared");

            long[] sealed = new long[1];
            assertThrows(IllegalArgumentException.class, () -> cache.evict(new int[] {pages[0], pages[1]}, 2, sealed));
            assertTrue(owned(a, pages[0]), "a refused eviction changes nothing");
            assertEquals(0, cache.evict(new int[] {pages[0]}, 1, sealed), "ZERO leaves no sealed reference");
            assertEquals(PageHandles.NONE, sealed[0]);
            assertFalse(owned(a, pages[0]));
        });
    }

    @Test
    void aBareSlotFreeNeverReleasesACachedPage() {
        withRequest(8, (a, cache, t, pages) -> {
            assertEquals(2, cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, new int[2]));
            ByteBuffer io = SlotAllocators.bind(a);
            io.putLong(0, (long) pages[0] * PAGE);
            for (long[] freer : new long[][] {{-1, -1}, {t, 9}}) {
                RuntimeException e = assertThrows(RuntimeException.class, () -> a.free(1, (int) freer[0], freer[1], 0));
                assertTrue(e.getMessage().contains("page " + pages[0]), e.getMessage());
            }
            assertEquals(2, a.rejectedFrees());
            assertTrue(owned(a, pages[0]), "only the cache releases its pages (SGLang's double free is refused)");
            assertTrue(a.pool().view().leaseOf(pages[0], t, PrefixCacheBridge.CACHE_NAMESPACE, LeaseKind.NAMESPACE) != LeaseIds.NONE);
        });
    }

    @Test
    void aPageTheRequestFreedInItsReleaseEndsWhatTheCacheTakes() {
        withRequest(14, (a, cache, t, pages) -> { // three full pages and a partial one
            ByteBuffer io = SlotAllocators.bind(a);
            io.putLong(0, (long) pages[1] * PAGE);
            assertEquals(0, a.free(1, t, 9, SlotAllocator.IN_FREE_GROUP), "a stale free of the request's own page stands");
            int[] taken = new int[3];
            assertEquals(1, cache.settle(9, t, 0, 3, 4, new byte[] {1, 1, 1}, taken));
            assertArrayEquals(new int[] {pages[0], -1, -1}, taken);
            assertEquals(-1, a.requestOf(pages[0]), "the page before the freed one is the cache's");
            assertEquals(9, a.requestOf(pages[2]), "past the freed page the request keeps its page for its release");
            assertFalse(owned(a, pages[3]), "the unaligned tail goes back to the pool");
            assertEquals(1, a.endRequestFrees(9, t, 0));
            assertFalse(owned(a, pages[1]));
            assertEquals(1, a.releaseLeftovers(9, t, 0));
            assertFalse(owned(a, pages[2]));
            assertTrue(owned(a, pages[0]));
        });
    }

    @Test
    void settleOfAPositionTheRequestDoesNotHoldChangesNothing() {
        withRequest(4, (a, cache, t, pages) -> {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, new int[2]));
            assertTrue(e.getMessage().contains("position 1"), e.getMessage());
            assertEquals(9, a.requestOf(pages[0]), "nothing was taken");
        });
    }
}
