package dev.kvshield.testing;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** Raw access to page bytes behind the pool's back: what a leak would read. */
public final class PoolProbe {
    private PoolProbe() {}

    /** Every byte of a page across all buffers, concatenated. */
    public static MemorySegment rawPage(PageMemory memory, Arena arena, int page) {
        PoolGeometry g = memory.geometry();
        MemorySegment all = arena.allocate(g.pageBytesAllBuffers());
        long at = 0;
        for (int b = 0; b < g.bufferCount(); b++) {
            MemorySegment dst = all.asSlice(at, g.pageBytes(b));
            memory.read(page, b, 0, dst);
            at += g.pageBytes(b);
        }
        return all;
    }

    /** Writes a tenant pattern into every buffer and slot of a page, straight to memory. */
    public static void fillPage(PageMemory memory, Arena arena, int page, int tenant, long request) {
        PoolGeometry g = memory.geometry();
        for (int b = 0; b < g.bufferCount(); b++) {
            memory.write(page, b, 0, Patterns.fill(arena, g.pageBytes(b), tenant, request, page, b));
        }
    }

    /** True if every buffer of the page holds the (tenant, request) pattern. */
    public static boolean holdsPattern(PageMemory memory, Arena arena, int page, int tenant, long request) {
        PoolGeometry g = memory.geometry();
        for (int b = 0; b < g.bufferCount(); b++) {
            MemorySegment dst = arena.allocate(g.pageBytes(b));
            memory.read(page, b, 0, dst);
            if (!Patterns.matches(dst, tenant, request, page, b)) {
                return false;
            }
        }
        return true;
    }
}
