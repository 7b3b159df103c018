package dev.kvshield.perf.simulate;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class CanaryTest {
    @Test
    void everyCellDecodesToItsWriterAndPosition() {
        try (Arena arena = Arena.ofConfined()) {
            int bpt = 64;
            MemorySegment s = arena.allocate(3L * bpt);
            Canary.fill(s, 5, 123_456_789L, 40, 3, 7, bpt);
            for (int t = 0; t < 3; t++) {
                for (int c = 0; c < bpt / Canary.CELL_BYTES; c++) {
                    long at = (long) t * bpt + (long) c * Canary.CELL_BYTES;
                    assertEquals(Canary.CANARY, Canary.classify(s, at, 7, c));
                    assertEquals(5, Canary.tenantOf(s, at));
                    assertEquals(123_456_789L, Canary.requestOf(s, at));
                    assertEquals(40 + t, Canary.positionOf(s, at));
                }
            }
        }
    }

    @Test
    void zeroIsZeroAndRandomBytesAreNoiseNotCanary() {
        long seed = 11;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(16 * 4096L);
            assertEquals(Canary.ZERO, Canary.classify(s, 0, 0, 0));
            SplittableRandom random = new SplittableRandom(seed);
            for (long at = 0; at < s.byteSize(); at += 8) {
                s.set(ValueLayout.JAVA_LONG_UNALIGNED, at, random.nextLong());
            }
            for (int cell = 0; cell < 4096; cell++) {
                assertEquals(Canary.NOISE, Canary.classify(s, cell * 16L, 0, 0), "seed " + seed + " cell " + cell);
            }
        }
    }

    @Test
    void aCellMovedToAnotherBufferOrSlotFailsItsCheck() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(32);
            Canary.fill(s, 1, 2, 3, 1, 4, 32);
            assertEquals(Canary.NOISE, Canary.classify(s, 0, 5, 0));
            assertEquals(Canary.NOISE, Canary.classify(s, 16, 4, 0));
        }
    }
}
