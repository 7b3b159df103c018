package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Host scratch for moving one page's KV: per buffer of a geometry, one region of a page's bytes,
 * and for every token count {@code 1 .. pageSizeTokens} the slices of exactly that many slots,
 * one per buffer, in the shape {@link ServingPool#write} and {@link ServingPool#read} take.
 *
 * <p>Single-threaded; the regions live as long as the arena they were allocated in. The slices
 * of different token counts overlap: one transfer at a time.
 */
public final class PageScratch {
    /** slots[tokens][buffer]: {@code tokens} slots of that buffer's region. */
    private final MemorySegment[][] slots;

    public PageScratch(PoolGeometry geometry, Arena arena) {
        int buffers = geometry.bufferCount();
        int pageSize = geometry.pageSizeTokens();
        slots = new MemorySegment[pageSize + 1][buffers];
        for (int b = 0; b < buffers; b++) {
            MemorySegment region = arena.allocate(geometry.pageBytes(b), 16);
            for (int t = 1; t <= pageSize; t++) {
                slots[t][b] = region.asSlice(0, (long) t * geometry.bytesPerToken(b));
            }
        }
    }

    /** The slices of {@code tokens} slots, one per buffer (the same array on every call). */
    public MemorySegment[] slots(int tokens) {
        return slots[tokens];
    }
}
