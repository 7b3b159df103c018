package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.bridge.handoff.HandoffBridge;
import dev.kvshield.bridge.handoff.PrefillSends;
import dev.kvshield.bridge.prefix.PrefixCacheBridge;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.UnknownTenantException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * Every bridge entry point (prefix cache, handoff, prefill sends) refuses a request id of the pool's
 * own holders, an unregistered tenant, and output arrays too short for what it writes, before it
 * changes anything: the pool's state digest and the page lists are as they were.
 */
class BridgeEntryChecksTest {
    private static final int PAGES = 9;
    private static final long PEER = 3;
    private static final long[] RESERVED = {(1L << 62) - 2, (1L << 62) - 1, -1};

    /** Runs {@code call}, expecting {@code type}, and checks the pool and request 9's page list did not change. */
    private static void refusedUnchanged(SlotAllocator a, Class<? extends Throwable> type, Executable call) {
        long digest = a.pool().stateDigest();
        int listed = a.heldPages(9);
        assertThrows(type, call);
        assertEquals(digest, a.pool().stateDigest());
        assertEquals(listed, a.heldPages(9));
    }

    @Test
    void reservedRequestIdsAreRefusedEverywhere() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m);
                HandoffBridge handoff = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            PrefillSends sends = new PrefillSends(a);
            int[] pages = SlotAllocators.allocate(a, 9, t, 8);
            assertEquals(2, cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, new int[2]));
            handoff.handshake(PEER, handoff.effectiveLimitTokens());
            for (long id : RESERVED) {
                Class<IllegalArgumentException> iae = IllegalArgumentException.class;
                refusedUnchanged(a, iae, () -> cache.settle(id, t, 0, 0, 1, new byte[0], new int[0]));
                refusedUnchanged(a, iae, () -> cache.addReaders(t, t, id, pages, 1));
                refusedUnchanged(a, iae, () -> cache.removeReaders(t, t, id, pages, 1));
                refusedUnchanged(a, iae, () -> handoff.reserve(id, t, 8, PEER, new int[PAGES]));
                refusedUnchanged(a, iae, () -> handoff.begin(id, t, 8, pages, PEER));
                refusedUnchanged(a, iae, () -> handoff.hasReservation(id));
                refusedUnchanged(a, iae, () -> handoff.commit(id, 8));
                refusedUnchanged(a, iae, () -> sends.begin(id, t, 8, PEER));
                refusedUnchanged(a, iae, () -> sends.claim(id, pages, 1));
                assertEquals(0, sends.active());
            }
        }
    }

    @Test
    void unregisteredTenantsAreRefusedBeforeAnythingIsRecorded() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m);
                HandoffBridge handoff = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            SlotAllocators.allocate(a, 9, t, 8);
            handoff.handshake(PEER, handoff.effectiveLimitTokens());
            UnknownTenantException e = assertThrows(UnknownTenantException.class,
                    () -> new PrefillSends(a).begin(2, 99, 8, PEER));
            assertEquals(true, e.getMessage().contains("99"), e.getMessage());
            refusedUnchanged(a, UnknownTenantException.class, () -> handoff.reserve(5, 99, 8, PEER, new int[PAGES]));
            refusedUnchanged(a, UnknownTenantException.class, () -> cache.settle(9, 99, 0, 2, 2, new byte[] {1, 1}, new int[2]));
            assertEquals(false, handoff.hasReservation(5));
        }
    }

    @Test
    void shortArraysAndBadTakeValuesChangeNothing() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m)) {
            int t = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            SlotAllocators.allocate(a, 9, t, 12);
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.settle(9, t, 0, 2, 3, new byte[] {1, 2}, new int[2]));
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.settle(9, t, 0, 2, 3, new byte[] {1, 1}, new int[1]));
            int[] taken = new int[2];
            assertEquals(2, cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, taken));
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.evict(taken, 2, new long[1]));
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.reclaim(t, new long[1], 2, new int[2]));
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.reclaim(t, new long[2], 2, new int[1]));
        }
    }

    @Test
    void aSettleOfATailAnotherTenantHoldsIsRefusedAndTheListKept() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m)) {
            int alpha = a.tenantId("alpha");
            int bravo = a.tenantId("bravo");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            long before = a.availablePages();
            SlotAllocators.allocate(a, 9, alpha, 10);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> cache.settle(9, bravo, 0, 0, 3, new byte[0], new int[0]));
            assertEquals(true, e.getMessage().contains("does not hold page"), e.getMessage());
            refusedUnchanged(a, IllegalArgumentException.class, () -> cache.settle(9, bravo, 0, 1, 3, new byte[] {1}, new int[1]));
            assertEquals(3, a.heldPages(9));
            assertEquals(1, cache.settle(9, alpha, 0, 1, 3, new byte[] {1}, new int[1]), "the holder's own settle still works");
            assertEquals(0, a.heldPages(9));
            a.releaseAll();
            assertEquals(before - 1, a.availablePages(), "nothing leaked: only the cached page is held, by the prefix cache");
        }
    }

    /**
     * Promise (HandoffBridge / brief target 4: every bridge entry point "checks its request id ... and all its pages before
     * changing anything": fail closed, loudly, pool unchanged; SlotAllocator: "a request id belongs to the tenant of the
     * pages it holds here"). {@code HandoffBridge.reserve} checks the request id, the tenant and pagesOut, then RESERVES
     * (receiver.reserve: pages leave the free list for (tenant, request), the reservation is recorded) and only then lists
     * the pages ({@code recordRequestPages}), which refuses a request already listed as another tenant's. The refusal
     * comes after the pool changed: the exception escapes with the reservation made and kept -- the pool's digest
     * differs, {@code hasReservation} is true, and the free pages are down by the reservation. Request 9 holds acme's
     * page; a reserve of request 9 as globex must be refused with nothing changed.
     */
    @Test
    void aReserveForARequestOfAnotherTenantChangesNothing() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m);
                HandoffBridge handoff = new HandoffBridge(a)) {
            int acme = a.tenantId("acme");
            int globex = a.tenantId("globex");
            SlotAllocators.allocate(a, 9, acme, 4);
            handoff.handshake(PEER, handoff.effectiveLimitTokens());
            long digest = a.pool().stateDigest();
            int available = a.availablePages();
            assertThrows(ForeignAccessException.class, () -> handoff.reserve(9, globex, 8, PEER, new int[PAGES]));
            assertFalse(handoff.hasReservation(9), "the refused reserve left its reservation recorded");
            assertEquals(available, a.availablePages(), "the refused reserve took free pages");
            assertEquals(digest, a.pool().stateDigest(), "the refused reserve changed the pool");
        }
    }

    /**
     * Promise (the "closed allocator" checks of commit 5ecf6c8; brief: fail closed, loudly, pool unchanged). After
     * {@code SlotAllocator.close()} a {@code HandoffBridge.reserve} is refused only by {@code recordRequestPages}'s
     * {@code checkOpen}, i.e. after {@code receiver.reserve} already took the pages from the pool and the bridge recorded
     * the reservation: the refusal leaves a reservation behind on the closed allocator's pool.
     */
    @Test
    void aReserveOnAClosedAllocatorChangesNothing() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m);
                HandoffBridge handoff = new HandoffBridge(a)) {
            int acme = a.tenantId("acme");
            handoff.handshake(PEER, handoff.effectiveLimitTokens());
            a.close();
            long digest = a.pool().stateDigest();
            assertThrows(IllegalStateException.class, () -> handoff.reserve(5, acme, 8, PEER, new int[PAGES]));
            assertFalse(handoff.hasReservation(5), "the refused reserve on a closed allocator left its reservation recorded");
            assertEquals(digest, a.pool().stateDigest(), "the refused reserve on a closed allocator changed the pool");
        }
    }

    /**
     * Promise (as above: a closed allocator refuses, pool unchanged). {@code PrefixCacheBridge.addReaders} never asks
     * whether its allocator is open (only {@code settle} does, through {@code pageAt}): after {@code close()} (which
     * closes the pool) it still grants a reader lease on cached pages.
     */
    @Test
    void readerLeasesAreRefusedOnAClosedAllocator() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(SlotAllocators.smallPaged());
                SlotAllocator a = SlotAllocators.strictSmallPaged(m)) {
            int acme = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            SlotAllocators.allocate(a, 9, acme, 8);
            int[] cached = new int[2];
            assertEquals(2, cache.settle(9, acme, 0, 2, 2, new byte[] {1, 1}, cached));
            a.close();
            long digest = a.pool().stateDigest();
            assertThrows(IllegalStateException.class, () -> cache.addReaders(acme, acme, 11, cached, 2));
            assertEquals(digest, a.pool().stateDigest(), "a reader lease was granted on a closed allocator's pool");
        }
    }
}
