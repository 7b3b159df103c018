package dev.kvshield.cuda;

import java.lang.foreign.MemorySegment;

/**
 * Launches the kernels' host build with the arguments of {@link dev.kvshield.cuda.kernel.KernelAbi}.
 * Implemented by {@link HostKernels} (exact) and by planted-bug wrappers the tests must catch.
 */
interface KernelLauncher {
    void scrub(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount, MemorySegment entries,
            int count, int unitsPerRegion);

    void verifyZero(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
            MemorySegment entries, int count, int unitsPerRegion, MemorySegment dirty);

    void chacha20Xor(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
            MemorySegment entries, int count, int unitsPerRegion, MemorySegment keys);
}
