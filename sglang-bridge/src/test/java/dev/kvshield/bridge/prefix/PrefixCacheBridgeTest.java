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

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build();
    }

    @Test
    void settleTakesReleasesDuplicatesAndTailsAndEvictsInStep() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m)) {
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            int t = a.tenantId("acme");
            int[] pages = SlotAllocators.allocate(a, 9, t, 10); // two full pages and a partial one
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
        }
    }

    @Test
    void aBareSlotFreeNeverReleasesACachedPage() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m)) {
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            int t = a.tenantId("acme");
            int[] pages = SlotAllocators.allocate(a, 9, t, 8);
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
        }
    }

    @Test
    void settleOfAPositionTheRequestDoesNotHoldChangesNothing() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m)) {
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            int t = a.tenantId("acme");
            int[] pages = SlotAllocators.allocate(a, 9, t, 4);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, new int[2]));
            assertTrue(e.getMessage().contains("position 1"), e.getMessage());
            assertEquals(9, a.requestOf(pages[0]), "nothing was taken");
        }
    }
}
