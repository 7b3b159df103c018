package dev.kvshield.bridge.handoff;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.admission.RequestTooLongException;
import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Reader claims of prefill sends grow chunk by chunk over the pages the allocator's per-request list
 * names, keep released pages out of circulation until {@link PrefillSends#complete}, and survive an
 * expiry (fenced, never freed). The Python tests drive the same through SGLang's hooked mixin, with
 * planted-bug twins and bytes read back.
 */
class PrefillSendsTest {
    private static final int PAGE = 4;
    private static final int PAGES = 9;
    private static final long PEER = 5;
    private static final long REQUEST = 21;

    private final ByteBuffer io = ByteBuffer.allocateDirect(PAGES * PAGE * 8).order(ByteOrder.nativeOrder());
    private final ByteBuffer plan = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());

    private SlotAllocator allocator(OffHeapPageMemory m) {
        PoolGeometry g = m.geometry();
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", "true"), g, m);
        a.bind(io, plan);
        return a;
    }

    private static OffHeapPageMemory memory() {
        return OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build());
    }

    /** Allocates tokens {@code [fromTokens, toTokens)} of the request (page-aligned start); returns their page ids. */
    private int[] allocate(SlotAllocator a, int tenant, int fromTokens, int toTokens) {
        plan.asLongBuffer().put(0, new long[] {REQUEST, tenant, fromTokens, toTokens, -1});
        int pages = (toTokens - fromTokens + PAGE - 1) / PAGE;
        assertEquals(pages * PAGE, a.alloc(pages * PAGE, 1, 0));
        int[] out = new int[pages];
        for (int i = 0; i < pages; i++) {
            out[i] = (int) (io.getLong(i * PAGE * 8) / PAGE);
        }
        return out;
    }

    /** SGLang's release of the request's pages (a free of their first slots). */
    private void free(SlotAllocator a, int... pages) {
        for (int i = 0; i < pages.length; i++) {
            io.putLong(i * 8, (long) pages[i] * PAGE);
        }
        assertEquals(0, a.free(pages.length, -1, 0));
    }

    @Test
    void claimsGrowPerChunkAndHoldReleasedPagesUntilComplete() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] first = allocate(a, t, 0, 8);
            sends.begin(REQUEST, t, 10, PEER);
            assertEquals(2, sends.claim(REQUEST, 8));
            sends.markSent(REQUEST, 8);
            assertThrows(IllegalArgumentException.class, () -> sends.markSent(REQUEST, 10), "tokens beyond the claimed pages");
            int[] last = allocate(a, t, 8, 10);
            int[] listed = new int[PAGES];
            assertEquals(3, a.requestPages(REQUEST, 0, 3, listed));
            assertArrayEquals(new int[] {first[0], first[1], last[0]}, java.util.Arrays.copyOf(listed, 3));
            assertEquals(1, sends.claim(REQUEST, 10));
            assertEquals(0, sends.claim(REQUEST, 10), "pages already claimed are not claimed twice");
            sends.markSent(REQUEST, 10);
            long before = a.availablePages();
            free(a, first[0], first[1], last[0]);
            a.endStep();
            assertEquals(before, a.availablePages(), "released pages under reader claims must stay out of circulation");
            sends.complete(REQUEST);
            a.endStep();
            assertEquals(before + 3, a.availablePages());
            assertFalse(sends.has(REQUEST));
        }
    }

    @Test
    void refusalsNameTheValuesAndClaimNothing() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            assertThrows(RequestTooLongException.class, () -> sends.begin(REQUEST, t, 33, PEER));
            assertFalse(sends.has(REQUEST), "an oversized request records nothing");
            int[] pages = allocate(a, t, 0, 8);
            sends.begin(REQUEST, t, 8, PEER);
            free(a, pages[1]);
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> sends.claim(REQUEST, 8));
            assertTrue(e.getMessage().contains("positions [0, 2)"), e.getMessage());
            assertEquals(0, sends.claimedPages(REQUEST));
            assertThrows(IllegalStateException.class, () -> sends.begin(REQUEST, t, 8, PEER));
        }
    }

    @Test
    void expiryFencesAndAlarmsButNeverFrees() {
        try (OffHeapPageMemory m = memory(); SlotAllocator a = allocator(m)) {
            PrefillSends sends = new PrefillSends(a);
            int t = a.tenantId("acme");
            int[] pages = allocate(a, t, 0, 8);
            sends.begin(REQUEST, t, 8, PEER);
            sends.claim(REQUEST, 8);
            sends.expire(REQUEST);
            sends.expire(REQUEST);
            assertEquals(1, sends.alarms().length);
            assertTrue(sends.alarms()[0].contains("request " + REQUEST) && sends.alarms()[0].contains("2 source pages"),
                    sends.alarms()[0]);
            assertThrows(IllegalStateException.class, () -> sends.claim(REQUEST, 8));
            long before = a.availablePages();
            free(a, pages);
            a.endStep();
            assertEquals(before, a.availablePages(), "an expired send's pages must stay out of circulation");
            sends.complete(REQUEST);
            a.endStep();
            assertEquals(before + 2, a.availablePages());
            assertEquals(0, sends.active());
        }
    }
}
