package dev.kvshield.bridge.handoff;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.admission.LimitMismatchException;
import dev.kvshield.admission.RequestTooLongException;
import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.bridge.SlotAllocators;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The facades keep the {@link SlotAllocator}'s page table equal to the pool's ownership while
 * handoffs allocate, transfer and release pages behind it, and the in-process
 * transport moves exact bytes. The Python tests drive the scenarios with planted twins.
 */
class HandoffBridgeTest {
    private static final int PAGE = 4;
    private static final int PAGES = 9;
    private static final long PEER = 3;

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build();
    }

    private static SlotAllocator allocator(OffHeapPageMemory m, String context) {
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", context, "strict", "true"), geometry(), m);
        SlotAllocators.bind(a);
        return a;
    }

    @Test
    void reservationsAndRefusalsKeepThePageTableInStep() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m, "32");
                HandoffBridge decode = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            decode.handshake(PEER, decode.effectiveLimitTokens());
            int[] pages = new int[PAGES];
            assertEquals(3, decode.reserve(11, t, 10, PEER, pages));
            for (int i = 0; i < 3; i++) {
                assertEquals(11, a.requestOf(pages[i]));
                assertEquals(t, a.tenantOf(pages[i]));
            }
            assertFalse(decode.commit(11, 4).committed());
            for (int i = 0; i < 3; i++) {
                assertEquals(-1, a.requestOf(pages[i]), "a refused reservation's page must leave the request's page list");
                assertEquals(PageState.QUARANTINED, a.pool().view().stateOf(pages[i]), "and its hold: released, claims still live");
            }
            assertThrows(RequestTooLongException.class, () -> decode.reserve(12, t, decode.effectiveLimitTokens() + 1, PEER, pages));
            assertThrows(LimitMismatchException.class, () -> decode.handshake(PEER + 1, decode.effectiveLimitTokens() - 1));
        }
    }

    @Test
    void aRecordLivesUntilBothFinishAndAcknowledgement() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry()); SlotAllocator a = allocator(m, "32");
                HandoffBridge decode = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            decode.handshake(PEER, decode.effectiveLimitTokens());
            int[] pages = new int[PAGES];
            assertEquals(1, decode.reserve(21, t, 4, PEER, pages));
            decode.recordWritten(21, 0, 0, 4);
            assertTrue(decode.commit(21, 4).committed());
            decode.finish(21); // the request ended before its transport acknowledged
            assertTrue(decode.hasReservation(21), "finished before the acknowledgement: the claims still need it");
            assertEquals(1, decode.unacknowledged());
            decode.acknowledge(21);
            assertFalse(decode.hasReservation(21));
            assertEquals(0, decode.unacknowledged());
            assertEquals(1, decode.reserve(22, t, 4, PEER, pages));
            decode.abort(22);
            assertTrue(decode.hasReservation(22), "aborted, unacknowledged: kept for the acknowledgement or expiry");
            decode.acknowledge(22);
            assertFalse(decode.hasReservation(22));
        }
    }

    @Test
    void inProcessTransportCopiesExactBytesAndCommits() {
        try (OffHeapPageMemory pm = OffHeapPageMemory.allocate(geometry()); OffHeapPageMemory dm = OffHeapPageMemory.allocate(geometry());
                SlotAllocator pa = allocator(pm, "32"); SlotAllocator da = allocator(dm, "32");
                HandoffBridge prefill = new HandoffBridge(pa); HandoffBridge decode = new HandoffBridge(da);
                Arena arena = Arena.ofConfined()) {
            prefill.handshake(PEER, decode.effectiveLimitTokens());
            decode.handshake(PEER, prefill.effectiveLimitTokens());
            int tp = pa.tenantId("acme");
            int[] source = SlotAllocators.allocate(pa, 5, tp, 6);
            MemorySegment token = arena.allocate(geometry().bytesPerToken(0));
            for (int s = 0; s < 6; s++) {
                token.fill((byte) (40 + s));
                for (int b = 0; b < geometry().bufferCount(); b++) {
                    pa.pool().write(tp, dev.kvshield.tenant.Owners.request(5), pa.pool().view().leaseOf(source[s / PAGE], tp,
                            dev.kvshield.tenant.Owners.request(5), LeaseKind.OWNER), b, s % PAGE, token);
                }
            }
            prefill.begin(5, tp, 6, source, PEER);
            int[] reserved = new int[PAGES];
            assertEquals(2, decode.reserve(5, da.tenantId("acme"), 6, PEER, reserved));
            assertEquals(6, prefill.copyTo(decode, 5, 5, 0, 2));
            prefill.markSent(5, 6);
            assertTrue(decode.commit(5, prefill.sentTokens(5)).committed());
            decode.acknowledge(5);
            prefill.complete(5);
            MemorySegment back = arena.allocate(geometry().bytesPerToken(0));
            for (int s = 0; s < 6; s++) {
                for (int b = 0; b < geometry().bufferCount(); b++) {
                    int td = da.tenantOf(reserved[s / PAGE]);
                    da.pool().read(td, dev.kvshield.tenant.Owners.request(5), da.pool().view().leaseOf(reserved[s / PAGE], td,
                            dev.kvshield.tenant.Owners.request(5), LeaseKind.OWNER), b, s % PAGE, back);
                    byte[] expected = new byte[(int) back.byteSize()];
                    java.util.Arrays.fill(expected, (byte) (40 + s));
                    assertArrayEquals(expected, back.toArray(ValueLayout.JAVA_BYTE), "token " + s + " buffer " + b);
                }
            }
            decode.finish(5);
            assertEquals(PageState.QUARANTINED, da.pool().view().stateOf(reserved[0]), "finish released the committed pages");
        }
    }

    @Test
    void aLayoutMismatchNamesTheFirstDifferenceWithBothValues() {
        PoolGeometry base = geometry();
        assertEquals(null, HandoffBridge.layoutMismatch(base, PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE)
                .pageCount(PAGES + 3).build()), "pools of one token layout but different sizes copy buffer for buffer");
        assertEquals("page size 4 tokens, decode 8", HandoffBridge.layoutMismatch(base,
                PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(8).pageCount(PAGES).build()));
        assertEquals("2 KV buffers, decode 4", HandoffBridge.layoutMismatch(base,
                PoolGeometry.builder().mha(2, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build()));
        assertTrue(HandoffBridge.layoutMismatch(base, PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(PAGE)
                .pageCount(PAGES).build()).endsWith("of 16 bytes per token, decode buffer 0 (layer 0 K) of 8"));
    }
}
