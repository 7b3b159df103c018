package dev.kvshield.bridge;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;

/**
 * A {@link SlotAllocator} called directly, as a hostile or buggy caller would: a 17-page pool of one-slot-wide MHA
 * pages, the allocator bound to an {@code io} and a {@code plan} buffer the test writes and reads, the memory closed
 * after each test.
 */
abstract class SmallPoolFixture {
    static final int PAGES = 17;

    OffHeapPageMemory memory;
    LongBuffer io;
    LongBuffer plan;

    @AfterEach
    void close() {
        if (memory != null) {
            memory.close();
        }
    }

    SlotAllocator allocator(int page) {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(page).pageCount(PAGES).build());
        ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * page * 8).order(ByteOrder.nativeOrder());
        ByteBuffer planBytes = ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
        io = ioBytes.asLongBuffer();
        plan = planBytes.asLongBuffer();
        SlotAllocator a = SlotAllocator.create(new HashMap<>(Map.of("advertisedContextTokens", "16")), memory.geometry(), memory);
        a.bind(ioBytes, planBytes);
        return a;
    }

    void row(int r, long request, int tenant, long prefix, long seq, long lastLoc) {
        plan.put(r * SlotAllocator.PLAN_ROW, new long[] {request, tenant, prefix, seq, lastLoc});
    }
}
