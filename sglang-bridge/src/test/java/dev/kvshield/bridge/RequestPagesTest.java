package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Per-request page lists: extensions take {@code last_loc} from them, and {@code freeSegment}
 * frees a row segment's pages from them, so page ids never come back from the device. Checked
 * against the slots the allocator itself returned for each position (SGLang's row).
 */
class RequestPagesTest {
    private static final int PAGE = 4;
    private static final int PAGES = 65;

    private final OffHeapPageMemory memory = OffHeapPageMemory.allocate(
            PoolGeometry.builder().mha(1, 1, 2, 4).pageSizeTokens(PAGE).pageCount(PAGES).build());
    private final ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * PAGE * 8).order(ByteOrder.nativeOrder());
    private final ByteBuffer planBytes = ByteBuffer.allocateDirect(64 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
    private final LongBuffer io = ioBytes.asLongBuffer();
    private final LongBuffer plan = planBytes.asLongBuffer();

    @AfterEach
    void closeMemory() {
        memory.close();
    }

    private SlotAllocator allocator(Map<String, String> settings) {
        SlotAllocator a = SlotAllocator.create(settings, memory.geometry(), memory);
        a.bind(ioBytes, planBytes);
        return a;
    }

    private void row(int r, long request, int tenant, long prefix, long seq, long lastLoc) {
        plan.put(r * SlotAllocator.PLAN_ROW, new long[] {request, tenant, prefix, seq, lastLoc});
    }

    @Test
    void lastLocComesFromTheRequestsOwnPartialPage() {
        SlotAllocator a = allocator(Map.of("advertisedContextTokens", "64"));
        int t = a.tenantId("acme");
        row(0, 3, t, 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        row(0, 3, t, 6, 7, -1); // decode: position 6 fills page 2 (slots 8..11) after slot 9
        assertEquals(1, a.allocExtend(1, 1, 0));
        assertEquals(10, io.get(0));
        row(0, 3, t, 7, 10, -1);
        assertEquals(3, a.allocExtend(1, 3, 0));
        assertArrayEquals(new long[] {11, 12, 13}, new long[] {io.get(0), io.get(1), io.get(2)});
        assertEquals(2, a.pageAt(3, 1));
        assertEquals(3, a.pageAt(3, 2));
        assertEquals(-1, a.pageAt(3, 3));
    }

    private static boolean owned(SlotAllocator a, int page) {
        return a.pool().view().stateOf(page) == PageState.OWNED;
    }

    @Test
    void unattributedRowsAskForAnExplicitLastLocAndChangeNothing() {
        SlotAllocator a = allocator(Map.of("advertisedContextTokens", "64"));
        row(0, -1, a.defaultTenant(), 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        long digest = a.pool().stateDigest();
        row(0, -1, a.defaultTenant(), 6, 7, -1);
        assertEquals(-2, a.allocExtend(1, 1, 0));
        assertEquals(digest, a.pool().stateDigest());
        row(0, -1, a.defaultTenant(), 6, 7, 9);
        assertEquals(1, a.allocExtend(1, 1, 0));
        assertEquals(10, io.get(0));
    }

    @Test
    void freeSegmentFreesTheSegmentsPagesAndFallsBackWhenItCannotNameThem() {
        SlotAllocator a = allocator(Map.of("advertisedContextTokens", "64", "strict", "true"));
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 14, -1);
        row(1, 6, t, 0, 4, -1);
        assertEquals(18, a.allocExtend(2, 18, 0));
        assertEquals(0, a.freeSegment(5, 8, 6, t, 0)); // positions 8..13: pages 3 and 4 (the partial one whole)
        assertFalse(owned(a, 3));
        assertFalse(owned(a, 4));
        assertTrue(owned(a, 2) && owned(a, 5));
        long digest = a.pool().stateDigest();
        assertEquals(-1, a.freeSegment(5, 4, 8, t, 0)); // position 8.. no longer the request's
        assertEquals(-1, a.freeSegment(9, 0, 4, t, 0)); // a request with no pages here
        assertEquals(digest, a.pool().stateDigest());
        assertEquals(0, a.freeSegment(5, 6, 2, t, 0)); // no page starts in [6, 8): SGLang's stride frees none
        assertTrue(owned(a, 2));
        assertEquals(0, a.freeSegment(5, 0, 8, t, 0));
        assertEquals(-1, a.pageAt(5, 0));
        io.put(0, 8);
        assertThrows(ForeignAccessException.class, () -> a.free(1, t, 5, 0)); // the list path released it like free()
    }

    @Test
    void freeSegmentOfAnotherTenantsRequestIsRejectedLikeFree() {
        SlotAllocator a = allocator(Map.of("advertisedContextTokens", "64"));
        int t1 = a.tenantId("acme");
        int t2 = a.tenantId("globex");
        row(0, 5, t1, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        assertEquals(2, a.freeSegment(5, 0, 8, t2, 0));
        assertTrue(owned(a, 1) && owned(a, 2));
        assertEquals(2, a.rejectedFrees());
    }

    /** Random chunked prefills, decodes and tail frees of several requests against the slots returned. */
    @Test
    void pageListsAgreeWithTheReturnedSlotsUnderRandomSchedules() {
        long seed = 0xC0FFEEL;
        SplittableRandom rnd = new SplittableRandom(seed);
        SlotAllocator a = allocator(Map.of("advertisedContextTokens", "256", "strict", "true"));
        int t = a.tenantId("acme");
        Map<Long, List<Long>> rows = new HashMap<>(); // request -> slot per position (SGLang's req_to_token row)
        for (int step = 0; step < 400; step++) {
            long request = rnd.nextInt(6);
            List<Long> rowSlots = rows.computeIfAbsent(request, k -> new ArrayList<>());
            int op = rnd.nextInt(3);
            if (op < 2) {
                int len = rowSlots.size();
                int add = op == 0 ? 1 + rnd.nextInt(9) : 1;
                row(0, request, t, len, len + add, -1);
                long r = a.allocExtend(1, add, SlotAllocator.STEP_BOUNDARY);
                if (r < 0) {
                    continue;
                }
                for (int i = 0; i < add; i++) {
                    rowSlots.add(io.get(i));
                }
            } else if (!rowSlots.isEmpty()) {
                int keepPages = rnd.nextInt(rowSlots.size() / PAGE + 1);
                int from = keepPages * PAGE;
                int n = rowSlots.size() - from;
                assertEquals(0, a.freeSegment(request, from, n, t, 0), "seed " + seed + " step " + step);
                for (int pos = from; pos < rowSlots.size(); pos += PAGE) {
                    assertFalse(owned(a, (int) (rowSlots.get(pos) / PAGE)), "seed " + seed + " step " + step);
                }
                rowSlots.subList(from, rowSlots.size()).clear();
            }
            for (int pos = 0; pos < rowSlots.size(); pos++) {
                assertEquals(rowSlots.get(pos) / PAGE, a.pageAt(request, pos / PAGE), "seed " + seed + " step " + step);
                assertEquals(pos % PAGE, rowSlots.get(pos) % PAGE, "seed " + seed + " step " + step);
            }
        }
        assertEquals(0, a.rejectedFrees());
    }
}
