package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

/**
 * Frees, releases and request page lists called with bad arguments (an overflowing segment, a negative request id,
 * a page another request holds or outside the pool) throw naming the values with nothing half-applied, and pages a
 * request freed inside SGLang's free group are released with it.
 */
class FreeChecksTest extends SmallPoolFixture {
    /**
     * Promise (brief / class contract: negative or overflowing counts throw naming the values): freeSegment checks
     * {@code startPos + count > slotCount} in long arithmetic that overflows, so startPos = Long.MAX_VALUE - 2, count = 3
     * passes the check and the call returns -1 ("free by slots instead") instead of throwing.
     */
    @Test
    void freeSegmentWithAnOverflowingSegmentDoesNotThrow() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        assertThrows(IllegalArgumentException.class, () -> a.freeSegment(5, Long.MAX_VALUE - 2, 3, t, 0));
    }

    /**
     * Promise (endRequestFrees/releaseRequest: a request's id is >= 0, releaseRequest refuses "a request id >= 0"; class
     * javadoc IN_FREE_GROUP: pages freed inside SGLang's free group "are released together at endFreeGroup"):
     * {@code endRequestFrees} does not check the request id; {@code holderOf(-3)} maps every negative id to UNATTRIBUTED,
     * so {@code endRequestFrees(-3, defaultTenant)} releases the engine's unattributed frees deferred inside the open free
     * group before {@code endFreeGroup}.
     */
    @Test
    void endRequestFreesWithANegativeIdReleasesTheOpenFreeGroup() {
        SlotAllocator a = allocator(1);
        assertEquals(4, a.alloc(4, 0, 0)); // no plan: unattributed
        assertEquals(0, a.free(4, a.defaultTenant(), -1, SlotAllocator.IN_FREE_GROUP));
        assertEquals(4, a.pendingGroupPages());
        long digest = a.pool().stateDigest();
        assertThrows(IllegalArgumentException.class, () -> a.endRequestFrees(-3, a.defaultTenant(), 0));
        assertEquals(4, a.pendingGroupPages(), "the free group's pages were released before endFreeGroup");
        assertEquals(digest, a.pool().stateDigest());
    }

    /**
     * Ambiguous promise (class javadoc, IN_FREE_GROUP: inside SGLang's free group "the pages become deferred frees of the
     * request ... and are released together at endFreeGroup"; README: "Inside SGLang's free group the freed pages stay
     * held until free_group_end"): the group's deferred frees and a request release's deferred frees share one list keyed
     * by (tenant, holder), so a request's releaseRequest while SGLang's group is open releases (through endRequestFrees)
     * the page the request freed in the group earlier, before endFreeGroup. (endRequestFrees' javadoc says SGLang's open
     * group "ends with endFreeGroup instead"; releaseRequest, which calls it, has no such caveat and no way to tell.)
     */
    @Test
    void releaseRequestReleasesThePagesTheRequestFreedInsideAnOpenFreeGroup() {
        SlotAllocator a = allocator(1);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 4, -1);
        assertEquals(4, a.alloc(4, 1, 0));
        long[] slots = new long[4];
        io.get(0, slots);
        io.put(0, slots[0]);
        assertEquals(0, a.free(1, t, 5, SlotAllocator.IN_FREE_GROUP)); // SGLang's free group is open
        assertEquals(1, a.pendingGroupPages());
        io.put(0, slots[1]);
        assertEquals(0, a.releaseRequest(1, t, 5, true, 0)); // the request's release, still inside the group
        assertEquals(1, a.pendingGroupPages(), "the page freed inside SGLang's group was released before free_group_end");
    }

    /**
     * Promise (recordRequestPages javadoc: "Lists pages a request holds through another path"; releaseAll: clear()
     * "releases every page a request ... holds through this allocator"; brief: bad input fails closed): recordRequestPages
     * takes any page for any request without asking the pool whether that request holds it. Listing request 7's page
     * under request 9 unlinks it from request 7's list: request 7's releaseLeftovers no longer finds it, request 9's cannot
     * release it (not its hold), and releaseAll (which looks holds up through the lists) leaves it held for good.
     */
    @Test
    void recordRequestPagesOfAPageAnotherRequestHoldsLeaksIt() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        long before = a.availablePages();
        row(0, 7, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        int page = a.pageAt(7, 1);
        try {
            a.recordRequestPages(9, new int[] {page}, 1, 0);
        } catch (RuntimeException refused) {
            // fine: request 9 does not hold it
        }
        int leftovers = a.releaseLeftovers(7, t, 0);
        a.releaseAll();
        assertEquals(before, a.availablePages(), "page " + page + " leaked through clear()");
        assertEquals(2, leftovers, "request 7's leftovers missed the page relisted under request 9");
    }

    /**
     * Promise (brief: bad input throws naming the values and leaves everything as it was, nothing half-applied):
     * recordRequestPages with a page id outside the pool in its second entry links the first entry, then fails with a bare
     * ArrayIndexOutOfBoundsException (no value named by the allocator): page 3 is left listed under request 9.
     */
    @Test
    void recordRequestPagesWithAnOutOfRangePageIsHalfApplied() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 7, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        int page = a.pageAt(7, 0);
        RuntimeException e = assertThrows(RuntimeException.class, () -> a.recordRequestPages(9, new int[] {page, 999}, 2, 0));
        assertEquals(7, a.requestOf(page), "the first entry was applied before the failure (" + e + ")");
        assertEquals(IllegalArgumentException.class, e.getClass(), "not refused by a check: " + e);
    }
}
