package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Checks every page at hand-out, reading its bytes behind the pool's back: a page handed to a new
 * owner must be all zero; a page a tenant reclaims (a prefix hit under ENCRYPT) may hold only that
 * tenant's canary or zero. Anything else is residue, counted per page with whose data it was.
 *
 * <p>Not thread-safe; close it to free its scratch page.
 */
public final class ResidueOracle implements AutoCloseable {
    private final PageMemory memory;
    private final PoolGeometry geometry;
    private final Arena arena = Arena.ofConfined();
    private final MemorySegment scratch;
    private long dirtyPages;
    private long foreignResiduePages;

    public ResidueOracle(PageMemory memory) {
        this.memory = memory;
        this.geometry = memory.geometry();
        long max = 0;
        for (int b = 0; b < geometry.buffersPerLayer(); b++) {
            max = Math.max(max, geometry.pageBytes(b));
        }
        this.scratch = arena.allocate(max, 16);
    }

    /**
     * Checks a page handed to {@code tenant}; {@code reclaimed} says the tenant got back a page it
     * sealed itself, so its own canary is allowed.
     *
     * @return true if the page was clean
     */
    public boolean checkHandOut(int page, int tenant, boolean reclaimed) {
        boolean dirty = false;
        boolean foreign = false;
        for (int b = 0; b < geometry.bufferCount(); b++) {
            int bpt = geometry.bytesPerToken(b);
            int cells = bpt / Canary.CELL_BYTES;
            MemorySegment region = scratch.asSlice(0, geometry.pageBytes(b));
            memory.read(page, b, 0, region);
            long at = 0;
            for (int t = 0; t < geometry.pageSizeTokens(); t++) {
                for (int c = 0; c < cells; c++, at += Canary.CELL_BYTES) {
                    int kind = Canary.classify(region, at, b, c);
                    if (kind == Canary.ZERO) {
                        continue;
                    }
                    if (reclaimed && kind == Canary.CANARY && Canary.tenantOf(region, at) == tenant) {
                        continue;
                    }
                    dirty = true;
                    if (kind == Canary.CANARY && Canary.tenantOf(region, at) != tenant) {
                        foreign = true;
                    }
                }
            }
        }
        if (dirty) {
            dirtyPages++;
        }
        if (foreign) {
            foreignResiduePages++;
        }
        return !dirty;
    }

    /** Pages handed out holding anything but zero (or, reclaimed, the tenant's own data). */
    public long dirtyPages() {
        return dirtyPages;
    }

    /** Dirty pages holding another tenant's canary. */
    public long foreignResiduePages() {
        return foreignResiduePages;
    }

    @Override
    public void close() {
        arena.close();
    }
}
