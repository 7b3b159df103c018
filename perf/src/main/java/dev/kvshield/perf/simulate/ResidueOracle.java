package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Checks pages behind the pool's back, reading their bytes: at hand-out, a page handed to a new
 * owner must be all zero; a page a tenant reclaims (a prefix hit under ENCRYPT) may hold only that
 * tenant's canary or zero. Anything else is residue, counted per page with whose data it was. At
 * rest, a page whose seal completed must hold none of its tenant's canary: the hand-out check cannot
 * see a seal that left plaintext (the page is cleared before another tenant gets it, and its own
 * tenant may hold its canary again after a reclaim).
 *
 * <p>Not thread-safe; close it to free its scratch page (checks after that are not counted: the
 * run they belong to has ended).
 */
public final class ResidueOracle implements AutoCloseable {
    private final PageMemory memory;
    private final PoolGeometry geometry;
    private final Arena arena = Arena.ofConfined();
    private final MemorySegment scratch;
    private long dirtyPages;
    private long foreignResiduePages;
    private long plaintextSealedPages;
    private boolean closed;

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

    /**
     * Checks a page whose seal for {@code tenant} completed (released, sealed, not yet handed out):
     * it must hold no cell of the tenant's canary. Only the tenant's own canary counts, the only
     * plaintext its pages hold when the hand-out check passes: ciphertext passes a canary's 32-bit
     * check by chance, and the tenant match makes that 2^-48 per cell.
     *
     * @return true if the page held no plaintext
     */
    public boolean checkSealed(int page, int tenant) {
        if (closed) {
            return true;
        }
        for (int b = 0; b < geometry.bufferCount(); b++) {
            int cells = geometry.bytesPerToken(b) / Canary.CELL_BYTES;
            MemorySegment region = scratch.asSlice(0, geometry.pageBytes(b));
            memory.read(page, b, 0, region);
            long at = 0;
            for (int t = 0; t < geometry.pageSizeTokens(); t++) {
                for (int c = 0; c < cells; c++, at += Canary.CELL_BYTES) {
                    if (Canary.classify(region, at, b, c) == Canary.CANARY && Canary.tenantOf(region, at) == tenant) {
                        plaintextSealedPages++;
                        return false;
                    }
                }
            }
        }
        return true;
    }

    /** Pages handed out holding anything but zero (or, reclaimed, the tenant's own data). */
    public long dirtyPages() {
        return dirtyPages;
    }

    /** Dirty pages holding another tenant's canary. */
    public long foreignResiduePages() {
        return foreignResiduePages;
    }

    /** Sealed pages found holding their tenant's plaintext ({@link #checkSealed}). */
    public long plaintextSealedPages() {
        return plaintextSealedPages;
    }

    @Override
    public void close() {
        closed = true;
        arena.close();
    }
}
