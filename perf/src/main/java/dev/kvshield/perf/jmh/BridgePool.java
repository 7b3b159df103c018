package dev.kvshield.perf.jmh;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.Map;

/**
 * The bridge's {@link SlotAllocator} over an off-heap pool of 4096 pages (of {@link #PAGE_SIZE_TOKENS}
 * tokens, or of one for SGLang's token allocator) with a 4-byte token per buffer, so the bookkeeping,
 * not the scrub, dominates; {@code io} and {@code plan} are the shared buffers the Python facade writes.
 */
final class BridgePool implements AutoCloseable {
    static final int PAGE_SIZE_TOKENS = 16;
    private static final int PAGES = 4097;

    final OffHeapPageMemory memory;
    final SlotAllocator allocator;
    final LongBuffer io;
    final LongBuffer plan;

    BridgePool(String level) {
        this(level, PAGE_SIZE_TOKENS);
    }

    BridgePool(String level, int pageSizeTokens) {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(pageSizeTokens).pageCount(PAGES).build();
        memory = OffHeapPageMemory.allocate(g);
        allocator = SlotAllocator.create(Map.of("level", level, "advertisedContextTokens", "65536"), g, memory);
        ByteBuffer ioBuffer = ByteBuffer.allocateDirect(PAGES * pageSizeTokens * 8).order(ByteOrder.nativeOrder());
        ByteBuffer planBuffer = ByteBuffer.allocateDirect(SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
        allocator.bind(ioBuffer, planBuffer);
        io = ioBuffer.asLongBuffer();
        plan = planBuffer.asLongBuffer();
    }

    @Override
    public void close() {
        allocator.close();
        memory.close();
    }
}
