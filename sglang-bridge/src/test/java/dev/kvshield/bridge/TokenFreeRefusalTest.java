package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A request's free on SGLang's token allocator ({@code page_size == 1}) skips its refusal pass when
 * every page it names is the request's own and none is named twice. These are that shortcut's
 * planted-bug twins: one slot the request does not hold, or one slot named twice, must still be
 * refused (counted, named, the foreign page left as it was), and in strict mode refuse the whole
 * free with the pool unchanged.
 */
class TokenFreeRefusalTest {
    private static final int PAGES = 33;
    private static final byte OTHER_BYTE = 0x6C;

    private final OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry());
    private final ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * 8).order(ByteOrder.nativeOrder());
    private final ByteBuffer planBytes = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
    private final LongBuffer io = ioBytes.asLongBuffer();
    private final LongBuffer plan = planBytes.asLongBuffer();

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(1).pageCount(PAGES).build();
    }

    @AfterEach
    void close() {
        memory.close();
    }

    private SlotAllocator allocator(boolean strict) {
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", Boolean.toString(strict)), geometry(),
                memory);
        a.bind(ioBytes, planBytes);
        return a;
    }

    /** Allocates {@code tokens} slots for the request (one plan row) and returns them. */
    private long[] allocate(SlotAllocator a, long request, int tenant, int tokens) {
        plan.put(0, new long[] {request, tenant, 0, tokens, -1});
        assertEquals(tokens, a.alloc(tokens, 1, 0));
        long[] slots = new long[tokens];
        io.get(0, slots);
        return slots;
    }

    private void fill(long slot, byte b) {
        for (int buffer = 0; buffer < geometry().bufferCount(); buffer++) {
            memory.hostRegion((int) slot, buffer).fill(b);
        }
    }

    private boolean holds(long slot, byte b) {
        for (int buffer = 0; buffer < geometry().bufferCount(); buffer++) {
            for (byte x : memory.hostRegion((int) slot, buffer).toArray(ValueLayout.JAVA_BYTE)) {
                if (x != b) {
                    return false;
                }
            }
        }
        return true;
    }

    @Test
    void aFreeOfItsOwnSlotsReleasesThemAllWithNoRefusal() {
        try (SlotAllocator a = allocator(false)) {
            int t = a.tenantId("acme");
            long[] mine = allocate(a, 1, t, 8);
            io.put(0, mine);
            assertEquals(0, a.free(8, t, 1, 0));
            for (long s : mine) {
                assertEquals(PageState.QUARANTINED, a.pool().view().stateOf((int) s));
            }
            assertEquals(0, a.rejectedFrees());
        }
    }

    @Test
    void aForeignSlotAmongTheRequestsOwnIsRefusedAndKeepsItsOwnersBytes() {
        try (SlotAllocator a = allocator(false)) {
            int t = a.tenantId("acme");
            int u = a.tenantId("globex");
            long[] mine = allocate(a, 1, t, 4);
            long[] theirs = allocate(a, 2, u, 2);
            fill(theirs[0], OTHER_BYTE);
            io.put(0, new long[] {mine[0], mine[1], theirs[0], mine[2], mine[3]});
            assertEquals(1, a.free(5, t, 1, 0));
            assertEquals(1, a.rejectedFrees());
            assertTrue(a.lastRejection().contains("page " + theirs[0]), a.lastRejection());
            for (long s : mine) {
                assertEquals(PageState.QUARANTINED, a.pool().view().stateOf((int) s));
            }
            assertEquals(PageState.OWNED, a.pool().view().stateOf((int) theirs[0]));
            assertEquals(u, a.tenantOf((int) theirs[0]));
            assertEquals(2, a.requestOf((int) theirs[0]));
            a.endStep();
            assertTrue(holds(theirs[0], OTHER_BYTE), "the other request's page kept its bytes");
        }
    }

    @Test
    void aSlotNamedTwiceIsADoubleFreeOfItsSecondName() {
        try (SlotAllocator a = allocator(false)) {
            int t = a.tenantId("acme");
            long[] mine = allocate(a, 1, t, 3);
            io.put(0, new long[] {mine[0], mine[1], mine[1], mine[2]});
            assertEquals(1, a.free(4, t, 1, 0));
            assertEquals(1, a.rejectedFrees());
            assertTrue(a.lastRejection().contains("page " + mine[1]), a.lastRejection());
            for (long s : mine) {
                assertEquals(PageState.QUARANTINED, a.pool().view().stateOf((int) s));
            }
        }
    }

    @Test
    void inStrictModeEitherRefusalLeavesThePoolExactlyAsItWas() {
        try (SlotAllocator a = allocator(true)) {
            int t = a.tenantId("acme");
            int u = a.tenantId("globex");
            long[] mine = allocate(a, 1, t, 3);
            long[] theirs = allocate(a, 2, u, 1);
            long digest = a.pool().stateDigest();
            io.put(0, new long[] {mine[0], theirs[0], mine[1]});
            assertThrows(ForeignAccessException.class, () -> a.free(3, t, 1, 0));
            assertEquals(digest, a.pool().stateDigest());
            io.put(0, new long[] {mine[2], mine[2]});
            assertThrows(ForeignAccessException.class, () -> a.free(2, t, 1, 0));
            assertEquals(digest, a.pool().stateDigest());
            assertEquals(3, a.heldPages(1));
            assertEquals(2, a.rejectedFrees());
        }
    }

    /**
     * A handoff's reserved pages (a RESERVATION hold, one with the transfer's writer claim), before
     * commit, among the request's own: not all owned, so the free takes the reservation path; a
     * foreign slot among them is refused, in strict mode the whole free with the pool unchanged.
     */
    @Test
    void reservedPagesBeforeCommitAreFreedWithTheOwnAndAForeignSlotIsStillRefused() {
        for (boolean strict : new boolean[] {true, false}) {
            try (SlotAllocator a = allocator(strict)) {
                int t = a.tenantId("acme");
                int u = a.tenantId("globex");
                long[] mine = allocate(a, 1, t, 2);
                long[] theirs = allocate(a, 2, u, 1);
                long[] reserved = new long[2];
                assertTrue(a.pool().allocate(t, Owners.request(1), LeaseKind.RESERVATION, 2, reserved, 0));
                int[] reservedPages = {a.pool().view().pageOf(reserved[0]), a.pool().view().pageOf(reserved[1])};
                a.pool().claim(t, Owners.request(1), reserved, 0, 1, ClaimKind.WRITER, 9, new long[1], 0);
                a.recordRequestPages(1, reservedPages, 2, 2);
                fill(theirs[0], OTHER_BYTE);
                io.put(0, new long[] {reservedPages[0], mine[0], theirs[0], reservedPages[1], mine[1]});
                long digest = a.pool().stateDigest();
                if (strict) {
                    assertThrows(ForeignAccessException.class, () -> a.free(5, t, 1, 0));
                    assertEquals(digest, a.pool().stateDigest());
                    assertEquals(4, a.heldPages(1));
                    io.put(0, new long[] {reservedPages[0], mine[0], reservedPages[1], mine[1]});
                    assertEquals(0, a.free(4, t, 1, 0));
                } else {
                    assertEquals(1, a.free(5, t, 1, 0));
                    assertTrue(a.lastRejection().contains("page " + theirs[0]), a.lastRejection());
                }
                assertEquals(1, a.rejectedFrees());
                for (long s : new long[] {mine[0], mine[1], reservedPages[0], reservedPages[1]}) {
                    assertEquals(PageState.QUARANTINED, a.pool().view().stateOf((int) s), "strict " + strict + " slot " + s);
                }
                assertEquals(0, a.heldPages(1));
                assertEquals(PageState.OWNED, a.pool().view().stateOf((int) theirs[0]));
                a.endStep();
                assertTrue(holds(theirs[0], OTHER_BYTE), "the other request's page kept its bytes");
            }
        }
    }

    @Test
    void aFreeOfMoreSlotsThanThePoolHasIsRefusedByNameWithThePoolUnchanged() {
        try (SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32"), geometry(), memory)) {
            ByteBuffer wide = ByteBuffer.allocateDirect(2 * PAGES * 8).order(ByteOrder.nativeOrder());
            a.bind(wide, planBytes);
            int t = a.tenantId("acme");
            plan.put(0, new long[] {1, t, 0, 2, -1});
            assertEquals(2, a.alloc(2, 1, 0));
            long mine = wide.asLongBuffer().get(0);
            long digest = a.pool().stateDigest();
            for (int i = 0; i < 2 * PAGES; i++) {
                wide.asLongBuffer().put(i, mine); // the same slot named more times than the pool has slots
            }
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> a.free(2 * PAGES, t, 1, 0));
            assertTrue(e.getMessage().contains(String.valueOf(2 * PAGES)), e.getMessage());
            assertEquals(digest, a.pool().stateDigest());
            assertEquals(2, a.heldPages(1));
        }
    }
}
