package dev.kvshield.perf.report;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import dev.kvshield.perf.simulate.Sealers;

/**
 * The machine's own limits, measured in the same run as the pools so protection bandwidth is
 * quoted as a same-run ratio: a contiguous {@link MemorySegment#fill} (the memset roof a scrub is
 * compared with) and the raw ChaCha20 keystream XOR of tenant-keys over a contiguous region (the
 * roof of ENCRYPT's seal).
 *
 * <p>Not thread-safe; close it to free its regions.
 */
public final class Limits implements AutoCloseable {
    private final Arena arena = Arena.ofShared();
    private final MemorySegment fillRegion;
    private final MemorySegment cipherRegion;
    private final MemorySegment key;
    private final Sealers.RawCipher chacha20;
    private final int[] nonce = {1, 2, 3};

    /**
     * @param fillBytes bytes of the contiguous fill region (larger than the last-level cache)
     * @param chacha20 the raw cipher, or null
     */
    public Limits(long fillBytes, Sealers.RawCipher chacha20) {
        this.fillRegion = arena.allocate(fillBytes, 64);
        this.chacha20 = chacha20;
        this.cipherRegion = chacha20 == null ? null : arena.allocate(Math.min(fillBytes, 8L << 20), 64);
        this.key = arena.allocate(32, 16);
        for (int i = 0; i < 32; i++) {
            key.set(java.lang.foreign.ValueLayout.JAVA_BYTE, i, (byte) (i * 37 + 11));
        }
    }

    /** GB/s of one contiguous fill of the whole region, best of {@code reps}. */
    public double fillGBps(int reps) {
        long best = Long.MAX_VALUE;
        for (int i = 0; i < reps; i++) {
            long t0 = System.nanoTime();
            fillRegion.fill((byte) 0);
            best = Math.min(best, System.nanoTime() - t0);
        }
        return fillRegion.byteSize() / (double) best;
    }

    public boolean hasChaCha20() {
        return chacha20 != null;
    }

    /** GB/s of the raw ChaCha20 XOR over the cipher region, best of {@code reps}. */
    public double chacha20GBps(int reps) {
        if (chacha20 == null) {
            throw new IllegalStateException("no ChaCha20 implementation on the class path");
        }
        long best = Long.MAX_VALUE;
        for (int i = 0; i < reps; i++) {
            long t0 = System.nanoTime();
            chacha20.xor(key, nonce, 0L, cipherRegion);
            best = Math.min(best, System.nanoTime() - t0);
        }
        return cipherRegion.byteSize() / (double) best;
    }

    @Override
    public void close() {
        arena.close();
    }
}
