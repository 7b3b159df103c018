package dev.kvshield.memory.offheap;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.HostPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Page memory the pool allocates itself, off-heap: one shared {@link Arena} owning one segment per
 * buffer. Thread-safe for disjoint pages; {@link #close()} frees everything.
 */
public final class OffHeapPageMemory extends HostPageMemory {
    private final Arena arena;

    private OffHeapPageMemory(PoolGeometry geometry, Arena arena, MemorySegment[] buffers) {
        super(geometry, buffers);
        this.arena = arena;
    }

    /** Allocates zero-filled memory for every buffer of {@code geometry}. */
    public static OffHeapPageMemory allocate(PoolGeometry geometry) {
        Arena arena = Arena.ofShared();
        try {
            MemorySegment[] buffers = new MemorySegment[geometry.bufferCount()];
            for (int b = 0; b < buffers.length; b++) {
                buffers[b] = arena.allocate(geometry.bufferBytes(b), 64);
            }
            return new OffHeapPageMemory(geometry, arena, buffers);
        } catch (RuntimeException | OutOfMemoryError e) {
            arena.close();
            throw e;
        }
    }

    @Override
    public String describe() {
        return "off-heap host memory (" + geometry().bufferCount() + " buffers, " + geometry().pageCount() + " pages)";
    }

    @Override
    protected void release() {
        arena.close();
    }
}
