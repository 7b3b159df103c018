package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import org.junit.jupiter.api.Test;

/** The limits Java checks before any launch. */
class KernelAbiTest {
    private final PoolGeometry g = PoolGeometry.builder().mha(2, 1, 3, 2).pageSizeTokens(5).pageCount(130).build();

    @Test
    void unitsCoverTheLargestPageIncludingItsTail() {
        // 5 tokens x 6 bytes = 30-byte pages: two 16-byte units, one 64-byte block.
        assertEquals(2, KernelAbi.unitsPerRegion(g, KernelAbi.SCRUB_UNIT_BYTES));
        assertEquals(1, KernelAbi.unitsPerRegion(g, KernelAbi.CHACHA_BLOCK_BYTES));
        assertEquals(3L * 4 * 2, KernelAbi.totalUnits(g, 3, 2));
    }

    @Test
    void gridsAreAtLeastOneBlockAndAtMostTheDeviceCap() {
        assertEquals(1, KernelAbi.blocks(0, 100));
        assertEquals(1, KernelAbi.blocks(KernelAbi.THREADS_PER_BLOCK, 100));
        assertEquals(2, KernelAbi.blocks(KernelAbi.THREADS_PER_BLOCK + 1, 100));
        assertEquals(100, KernelAbi.blocks(Long.MAX_VALUE / 2, 100));
    }

    @Test
    void basesMustBePositiveAndSixteenByteAligned() {
        KernelAbi.checkBase(0, 0x7f0000001000L);
        InvalidGeometryException e = assertThrows(InvalidGeometryException.class, () -> KernelAbi.checkBase(3, 0x7f0000001008L));
        assertTrue(e.getMessage().contains("buffer 3") && e.getMessage().contains("7f0000001008"), e.getMessage());
        assertThrows(InvalidGeometryException.class, () -> KernelAbi.checkBase(0, 0));
    }

    @Test
    void sealBatchesRejectRepeatsBadSlotsAndRangesAndLeaveTheScratchClear() {
        long[] scratch = new long[(g.pageCount() + 63) / 64];
        int[] gens = new int[4];
        byte[] slots = {0, 1, 0, 1};
        KernelAbi.checkSealBatch(g, new int[] {1, 64, 129, 2}, gens, slots, 0, 4, 2, scratch);
        assertArrayEquals(new long[scratch.length], scratch);
        IllegalArgumentException twice = assertThrows(IllegalArgumentException.class,
                () -> KernelAbi.checkSealBatch(g, new int[] {1, 64, 1, 2}, gens, slots, 0, 4, 2, scratch));
        assertTrue(twice.getMessage().contains("page 1"), twice.getMessage());
        assertArrayEquals(new long[scratch.length], scratch);
        assertThrows(IllegalArgumentException.class,
                () -> KernelAbi.checkSealBatch(g, new int[] {1, 64, 3, 2}, gens, slots, 0, 4, 1, scratch));
        assertArrayEquals(new long[scratch.length], scratch);
        assertThrows(IllegalArgumentException.class,
                () -> KernelAbi.checkSealBatch(g, new int[] {1, 2}, gens, slots, 0, 2, KernelAbi.MAX_KEY_SLOTS + 1, scratch));
        assertThrows(InvalidGeometryException.class,
                () -> KernelAbi.checkSealBatch(g, new int[] {1, 130}, gens, slots, 0, 2, 2, scratch));
        assertThrows(IllegalArgumentException.class,
                () -> KernelAbi.checkSealBatch(g, new int[] {1, 2}, gens, slots, 1, 2, 2, scratch));
        assertArrayEquals(new long[scratch.length], scratch);
        // The same pages pass again once the scratch is clear.
        KernelAbi.checkSealBatch(g, new int[] {1, 64, 129, 2}, gens, slots, 0, 4, 2, scratch);
    }
}
