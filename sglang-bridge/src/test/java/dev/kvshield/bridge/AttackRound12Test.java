package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.bridge.handoff.HandoffBridge;
import dev.kvshield.bridge.prefix.PrefixCacheBridge;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.ForeignAccessException;
import org.junit.jupiter.api.Test;

/**
 * Twelfth attack round on the bridge's Java entry checks. Each test cites the promise it checks and fails on the code it
 * was written against because of the defect it names.
 */
class AttackRound12Test {
    private static final int PAGES = 9;
    private static final long PEER = 3;

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
     * Promise (round 10 fix 5ecf6c8: "closed allocator" checks; brief: fail closed, loudly, pool unchanged). After
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
