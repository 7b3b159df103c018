package dev.kvshield.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Kernel launchers with a planted bug, for the twins of the differential tests: each must make
 * the byte-for-byte comparison fail. Test code only.
 */
final class PlantedBugs {
    private PlantedBugs() {}

    /** Page stride one byte short: every page region starts and ends early (pageBytes - 1). */
    static KernelLauncher offByOnePageStride(KernelLauncher exact) {
        return new KernelLauncher() {
            @Override
            public void scrub(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units) {
                try (Arena a = Arena.ofConfined()) {
                    exact.scrub(blocks, threads, bases, shortStride(a, pageBytes), bufferCount, entries, count, units);
                }
            }

            @Override
            public void verifyZero(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment dirty) {
                try (Arena a = Arena.ofConfined()) {
                    exact.verifyZero(blocks, threads, bases, shortStride(a, pageBytes), bufferCount, entries, count, units, dirty);
                }
            }

            @Override
            public void chacha20Xor(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment keys) {
                try (Arena a = Arena.ofConfined()) {
                    exact.chacha20Xor(blocks, threads, bases, shortStride(a, pageBytes), bufferCount, entries, count, units, keys);
                }
            }
        };
    }

    /** The last buffer of the pool (the last layer's last K/V or latent buffer) is never visited. */
    static KernelLauncher skippedBuffer(KernelLauncher exact) {
        return new KernelLauncher() {
            @Override
            public void scrub(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units) {
                exact.scrub(blocks, threads, bases, pageBytes, bufferCount - 1, entries, count, units);
            }

            @Override
            public void verifyZero(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment dirty) {
                exact.verifyZero(blocks, threads, bases, pageBytes, bufferCount - 1, entries, count, units, dirty);
            }

            @Override
            public void chacha20Xor(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment keys) {
                exact.chacha20Xor(blocks, threads, bases, pageBytes, bufferCount - 1, entries, count, units, keys);
            }
        };
    }

    /** Exact scrub and chacha20-xor, verify-zero from {@code planted}: isolates the verify oracle. */
    static KernelLauncher onlyVerifyFrom(KernelLauncher exact, KernelLauncher planted) {
        return new KernelLauncher() {
            @Override
            public void scrub(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units) {
                exact.scrub(blocks, threads, bases, pageBytes, bufferCount, entries, count, units);
            }

            @Override
            public void verifyZero(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment dirty) {
                planted.verifyZero(blocks, threads, bases, pageBytes, bufferCount, entries, count, units, dirty);
            }

            @Override
            public void chacha20Xor(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
                    MemorySegment entries, int count, int units, MemorySegment keys) {
                exact.chacha20Xor(blocks, threads, bases, pageBytes, bufferCount, entries, count, units, keys);
            }
        };
    }

    private static MemorySegment shortStride(Arena arena, MemorySegment pageBytes) {
        MemorySegment wrong = arena.allocate(pageBytes.byteSize(), 4);
        for (long i = 0; i < pageBytes.byteSize() / 4; i++) {
            wrong.setAtIndex(ValueLayout.JAVA_INT, i, Math.max(1, pageBytes.getAtIndex(ValueLayout.JAVA_INT, i) - 1));
        }
        return wrong;
    }
}
