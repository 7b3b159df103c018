package dev.kvshield.bridge;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Map;

/** Test helpers for driving a {@link SlotAllocator} the way the Python facade does, without Python. */
public final class SlotAllocators {
    private SlotAllocators() {}

    /** Nine pages of four slots, one layer of MHA: small enough that every page's fate is checked. */
    public static PoolGeometry smallPaged() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(4).pageCount(9).build();
    }

    /** A strict allocator over {@code memory} (of {@link #smallPaged}), its buffers bound. */
    public static SlotAllocator strictSmallPaged(OffHeapPageMemory memory) {
        SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", "true"), smallPaged(), memory);
        bind(a);
        return a;
    }

    /** Binds fresh shared buffers: {@code io} for every slot of the pool, {@code plan} for four rows; returns {@code io}. */
    public static ByteBuffer bind(SlotAllocator a) {
        ByteBuffer io = ByteBuffer.allocateDirect(a.pageCount() * a.pageSizeTokens() * 8).order(ByteOrder.nativeOrder());
        a.bind(io, ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder()));
        return io;
    }

    /**
     * Allocates whole pages for {@code tokens} of (request, tenant) through one plan row, as an
     * extension from position 0; returns the page ids in position order.
     */
    public static int[] allocate(SlotAllocator a, long request, int tenant, int tokens) {
        int page = a.pageSizeTokens();
        ByteBuffer io = ByteBuffer.allocateDirect(a.pageCount() * page * 8).order(ByteOrder.nativeOrder());
        ByteBuffer plan = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
        a.bind(io, plan);
        plan.asLongBuffer().put(0, new long[] {request, tenant, 0, tokens, -1});
        int pages = (tokens + page - 1) / page;
        if (a.alloc(pages * page, 1, 0) != pages * page) {
            throw new AssertionError("allocating " + pages + " pages for request " + request + " failed");
        }
        int[] out = new int[pages];
        for (int i = 0; i < pages; i++) {
            out[i] = (int) (io.getLong(i * page * 8) / page);
        }
        return out;
    }
}
