package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.bridge.handoff.HandoffBridge;
import dev.kvshield.bridge.handoff.PrefillSends;
import org.junit.jupiter.api.Test;

/**
 * The handoff's entry points (decode reservations and commits, prefill sends) refuse the pool's own holder ids, an
 * unregistered tenant and output arrays too short for what they write before anything is reserved or recorded.
 */
class HandoffEntryChecksTest extends SmallPoolFixture {
    /** A decode-side reservation of 8 tokens (2 pages) committed for {@code request} of the default tenant; null when refused. */
    private static int[] reserveAndCommit(SlotAllocator a, HandoffBridge d, long request) {
        d.handshake(3, d.effectiveLimitTokens());
        int[] pages = new int[PAGES];
        try {
            assertEquals(2, d.reserve(request, a.defaultTenant(), 8, 3, pages));
        } catch (IllegalArgumentException refused) {
            return null; // the fixed behaviour: a reserved id refused before anything was reserved
        }
        d.recordWritten(request, 0, 0, 4);
        d.recordWritten(request, 1, 0, 4);
        assertEquals(true, d.commit(request, 8).committed());
        return pages;
    }

    /**
     * Promise (brief: request ids in the reserved range are refused; SlotAllocator: "Request ids at or above this one
     * are the pool's own holders, never a request's", UNATTRIBUTED = request (2^62 - 1)): {@code HandoffBridge.reserve}
     * only checks [0, 2^62), so a handoff request with id 2^62 - 1 gets its pages as holds of the UNATTRIBUTED holder.
     * After its commit the engine's plain unattributed free (request -1, no CACHE_EVICTION), which must never release a
     * request's page (DESIGN-NOTES 20), releases the handed-off request's pages.
     */
    @Test
    void handoffRequestWithTheUnattributedIdIsFreedByAnUnattributedFree() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            long id = (1L << 62) - 1;
            int[] pages = reserveAndCommit(a, d, id);
            if (pages == null) {
                return;
            }
            long[] slots = new long[8];
            for (int i = 0; i < 8; i++) {
                slots[i] = (long) pages[i / 4] * 4 + i % 4;
            }
            io.put(0, slots);
            assertEquals(2, a.free(8, a.defaultTenant(), -1, 0),
                    "an unattributed free released the pages of handoff request " + id);
        }
    }

    /**
     * Promise (releaseAll javadoc: SGLang's {@code clear()} "releases every page a request, the prefix cache or the
     * unattributed holder holds"; brief: fail closed, nothing half-applied): after a handoff reservation under the
     * reserved id 2^62 - 2 (accepted by {@code HandoffBridge.reserve}, see above) joined the page lists, every
     * {@code releaseAll} throws from {@code holderOf} ("one of the pool's own holders") after it has already ended the
     * free group: SGLang's clear crashes and nothing of the pool is released.
     */
    @Test
    void handoffRequestWithAReservedIdMakesClearThrow() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            int[] pages = reserveAndCommit(a, d, (1L << 62) - 2);
            if (pages == null) {
                return;
            }
            assertEquals(4, a.alloc(4, 0, 0));
            a.releaseAll();
            assertEquals(PAGES - 1 - 2, a.availablePages());
        }
    }

    /**
     * Promise (brief: bad input, here a pagesOut array too short for the request, throws and leaves the pool exactly as it
     * was; HandoffBridge.reserve javadoc lists its refusals as "before anything is reserved"): reserve reserves the pages
     * first and only then checks {@code pagesOut}; the undo (abort + acknowledge) leaves the two pages QUARANTINED
     * instead of FREE, with a reservation and an abort in their history, so the pool's state differs after the throw.
     */
    @Test
    void handoffReserveWithAShortPagesOutChangesThePoolBeforeThrowing() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            d.handshake(3, d.effectiveLimitTokens());
            long digest = a.pool().stateDigest();
            assertThrows(IllegalArgumentException.class, () -> d.reserve(5, t, 8, 3, new int[1]));
            int[] out = new int[PAGES];
            assertEquals(0, a.pagesIn(1 << dev.kvshield.lifecycle.PageState.QUARANTINED.ordinal(), out),
                    "pages reserved and aborted by a call refused for its argument");
            assertEquals(digest, a.pool().stateDigest());
        }
    }

    /**
     * Promise (brief: an unknown tenant id throws naming it, nothing recorded; HandoffBridge.reserve and the
     * SlotAllocator calls refuse unregistered tenants): PrefillSends.begin records a send for tenant 99, which was never
     * registered; only the first claim then fails (as a ForeignAccessException, not as an unknown tenant).
     */
    @Test
    void prefillSendBeginAcceptsAnUnregisteredTenant() {
        SlotAllocator a = allocator(4);
        PrefillSends sends = new PrefillSends(a);
        try {
            sends.begin(2, 99, 8, 3);
        } catch (RuntimeException refused) {
            assertEquals(false, sends.has(2));
            return;
        }
        assertEquals(false, sends.has(2), "a send was recorded for unregistered tenant 99");
    }
}
