package dev.kvshield.keys.cipher;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;

/**
 * The ChaCha20 stream cipher of RFC 8439 (20 rounds, 96-bit nonce, 32-bit block counter), XORing
 * its keystream in place into a {@link MemorySegment}: the CPU page cipher and the reference every
 * other implementation (the CUDA kernel) is compared with byte for byte.
 *
 * <p>State words: 0-3 the constants {@code "expand 32-byte k"}, 4-11 the key (little-endian
 * words), 12 the block counter, 13-15 the nonce words. Keystream block {@code i} of a call covers
 * bytes {@code [64 i, 64 i + 64)} of the data and uses counter {@code counter + i}; the last block
 * may be partial. A call whose blocks would take the counter past {@code 2^32 - 1} is refused
 * before any byte changes: the counter never wraps.
 *
 * <p>Stateless and thread-safe; allocates nothing once compiled. Key material is read from the key
 * segment into locals for the call; in compiled code the only heap copies are the per-thread scratch
 * of the JDK and wide paths (key words, keystream), zeroed before the call returns however it ends.
 * Until C2 compiles those paths (a JVM's first thousands of calls, and after a deoptimization) the
 * Vector API runs interpreted and boxes every vector in a heap object, so page bytes, keystream and,
 * on the wide paths, key words pass through unreachable heap objects nothing zeroes (the collector
 * reuses their memory later); the scalar path never does. Seen in heap dumps: one interpreted 4 KiB
 * call left its whole keystream on the heap (JDK path; key words too on the 8-lane path); calls after
 * warm-up left none.
 *
 * <p>Implementation notes: where the JVM lets this code call the JDK's own block function, which
 * HotSpot intrinsifies ({@code --add-opens java.base/com.sun.crypto.provider=ALL-UNNAMED}, which
 * every JVM this project starts passes), every block goes through it ({@code JdkChaCha20}: ~1.4x
 * the 8-lane path below on the project's AVX2 VM; key words and keystream pass through per-thread
 * heap scratch that is zeroed before the call returns). Otherwise, when the JVM runs with
 * {@code --add-modules jdk.incubator.vector} (every JVM this project starts does), whole groups of
 * blocks go through a wide path, one block
 * per vector lane: 16 at a time in {@code GatheredChaCha20} on a CPU with 512-bit vectors, 8 in
 * {@code VectorChaCha20} with 256-bit ones (their notes give the designs and the measured rates:
 * the 8-lane path ~2.3x this scalar code on the project's AVX2 VM); the remainder, and every block
 * elsewhere, runs the scalar code here (16 state words in locals, keystream XORed eight bytes at a
 * time through unaligned little-endian long accesses). Both work in place on the segment and
 * allocate nothing once compiled. Measured in {@code SealBenchmark} against the JDK's
 * {@code Cipher} (see {@code tenant-keys/API.md}): the JDK path needs a heap copy per region and
 * allocates per {@code init}, which a release path cannot afford.
 */
public final class ChaCha20 {
    /** Bytes of a ChaCha20 key. */
    public static final int KEY_BYTES = 32;
    /** Bytes of one keystream block. */
    public static final int BLOCK_BYTES = 64;
    /** Words of the nonce (state words 13-15). */
    public static final int NONCE_WORDS = 3;
    /** The largest block counter value plus one: counters run over {@code [0, 2^32)}. */
    public static final long COUNTER_LIMIT = 1L << 32;
    /** The most bytes one (key, nonce) can cover from counter 0: {@code 2^32 * 64}. */
    public static final long MAX_BYTES_PER_NONCE = COUNTER_LIMIT * BLOCK_BYTES;

    private static final ValueLayout.OfInt KEY_WORD = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong DATA_LONG = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final int C0 = 0x61707865;
    private static final int C1 = 0x3320646e;
    private static final int C2 = 0x79622d32;
    private static final int C3 = 0x6b206574;
    private static final boolean VECTOR_MODULE = ModuleLayer.boot().findModule("jdk.incubator.vector").isPresent();
    /** Whether this JVM takes the JDK's block function ({@code JdkChaCha20}, whose XOR needs the Vector API module). */
    private static final boolean JDK_BLOCKS = VECTOR_MODULE && JdkChaCha20.AVAILABLE;
    /**
     * Blocks per group of the wide path this JVM takes: 16 ({@code GatheredChaCha20}) on a CPU with
     * 512-bit vectors, 8 ({@code VectorChaCha20}) with 256-bit ones, 0 (scalar only) without the
     * Vector API module or on narrower vectors.
     */
    private static final int WIDE_LANES = !VECTOR_MODULE ? 0 : GatheredChaCha20.FITS ? GatheredChaCha20.LANES
            : VectorChaCha20.FITS ? VectorChaCha20.LANES : 0;

    private ChaCha20() {}

    /**
     * Which implementation runs in this JVM, for reports: {@code "jdk"} where the JDK's block
     * function is reachable ({@code JdkChaCha20}; intrinsified by HotSpot), else {@code "vector-<lanes>"}
     * with the Vector API module loaded on a CPU with 256-bit vectors, else {@code "scalar"}.
     */
    public static String implementation() {
        return JDK_BLOCKS ? "jdk" : WIDE_LANES > 0 ? "vector-" + WIDE_LANES : "scalar";
    }

    /**
     * XORs the keystream of {@code (key, nonceWords, counter)} into all of {@code data}.
     *
     * @param key exactly {@link #KEY_BYTES} bytes
     * @param nonceWords state words 13, 14, 15
     * @param counter the block counter of the first block, in {@code [0, 2^32)}
     * @throws IllegalArgumentException for a bad key size, nonce length, or a counter that would wrap
     */
    public static void xor(MemorySegment key, int[] nonceWords, long counter, MemorySegment data) {
        if (nonceWords.length != NONCE_WORDS) {
            throw new IllegalArgumentException("a ChaCha20 nonce is " + NONCE_WORDS + " words, got " + nonceWords.length);
        }
        xor(key, nonceWords[0], nonceWords[1], nonceWords[2], counter, data, 0, data.byteSize());
    }

    /**
     * XORs the keystream of {@code (key, nonce13..15, counter)} into {@code data[offset, offset +
     * lengthBytes)}; the keystream starts at that offset (block {@code counter} covers its first 64
     * bytes).
     *
     * @throws IllegalArgumentException for a bad key size, a range outside {@code data}, or a counter
     *     that would wrap; nothing is changed then
     */
    public static void xor(MemorySegment key, int nonce13, int nonce14, int nonce15, long counter, MemorySegment data,
            long offset, long lengthBytes) {
        if (key.byteSize() != KEY_BYTES) {
            throw new IllegalArgumentException("a ChaCha20 key is " + KEY_BYTES + " bytes, got a " + key.byteSize() + "-byte segment");
        }
        if (offset < 0 || lengthBytes < 0 || offset > data.byteSize() - lengthBytes) {
            throw new IllegalArgumentException("range of " + lengthBytes + " bytes at offset " + offset + " is outside a segment of "
                    + data.byteSize() + " bytes");
        }
        // ceilDiv: (lengthBytes + 63) / 64 overflows for lengths near Long.MAX_VALUE and would pass the check.
        long blocks = Math.ceilDiv(lengthBytes, BLOCK_BYTES);
        if (counter < 0 || counter >= COUNTER_LIMIT || counter > COUNTER_LIMIT - blocks) {
            throw new IllegalArgumentException("ChaCha20 block counter would wrap: first counter " + counter + " + " + blocks
                    + " blocks exceeds 2^32 (" + lengthBytes + " bytes)");
        }
        int k0 = key.get(KEY_WORD, 0);
        int k1 = key.get(KEY_WORD, 4);
        int k2 = key.get(KEY_WORD, 8);
        int k3 = key.get(KEY_WORD, 12);
        int k4 = key.get(KEY_WORD, 16);
        int k5 = key.get(KEY_WORD, 20);
        int k6 = key.get(KEY_WORD, 24);
        int k7 = key.get(KEY_WORD, 28);
        long position = offset;
        int blockCounter = (int) counter;
        if (JDK_BLOCKS) {
            JdkChaCha20.xor(k0, k1, k2, k3, k4, k5, k6, k7, nonce13, nonce14, nonce15, blockCounter, data, position, offset + lengthBytes);
            return;
        }
        if (WIDE_LANES > 0) {
            long groups = lengthBytes / BLOCK_BYTES / WIDE_LANES;
            if (WIDE_LANES == GatheredChaCha20.LANES) {
                GatheredChaCha20.xorGroups(k0, k1, k2, k3, k4, k5, k6, k7, nonce13, nonce14, nonce15, blockCounter, data, position, groups);
            } else {
                VectorChaCha20.xorGroups(k0, k1, k2, k3, k4, k5, k6, k7, nonce13, nonce14, nonce15, blockCounter, data, position, groups);
            }
            position += groups * WIDE_LANES * BLOCK_BYTES;
            blockCounter += (int) (groups * WIDE_LANES);
        }
        xorScalar(k0, k1, k2, k3, k4, k5, k6, k7, nonce13, nonce14, nonce15, blockCounter, data, position, offset + lengthBytes);
    }

    /** One block at a time from {@code position} to {@code end}; the caller checked ranges and counter wrap. */
    static void xorScalar(int k0, int k1, int k2, int k3, int k4, int k5, int k6, int k7, int nonce13, int nonce14, int nonce15,
            int firstCounter, MemorySegment data, long position, long end) {
        int blockCounter = firstCounter;
        while (position < end) {
            int x0 = C0, x1 = C1, x2 = C2, x3 = C3;
            int x4 = k0, x5 = k1, x6 = k2, x7 = k3;
            int x8 = k4, x9 = k5, x10 = k6, x11 = k7;
            int x12 = blockCounter, x13 = nonce13, x14 = nonce14, x15 = nonce15;
            for (int round = 0; round < 10; round++) {
                // Column round.
                x0 += x4; x12 = Integer.rotateLeft(x12 ^ x0, 16); x8 += x12; x4 = Integer.rotateLeft(x4 ^ x8, 12);
                x0 += x4; x12 = Integer.rotateLeft(x12 ^ x0, 8); x8 += x12; x4 = Integer.rotateLeft(x4 ^ x8, 7);
                x1 += x5; x13 = Integer.rotateLeft(x13 ^ x1, 16); x9 += x13; x5 = Integer.rotateLeft(x5 ^ x9, 12);
                x1 += x5; x13 = Integer.rotateLeft(x13 ^ x1, 8); x9 += x13; x5 = Integer.rotateLeft(x5 ^ x9, 7);
                x2 += x6; x14 = Integer.rotateLeft(x14 ^ x2, 16); x10 += x14; x6 = Integer.rotateLeft(x6 ^ x10, 12);
                x2 += x6; x14 = Integer.rotateLeft(x14 ^ x2, 8); x10 += x14; x6 = Integer.rotateLeft(x6 ^ x10, 7);
                x3 += x7; x15 = Integer.rotateLeft(x15 ^ x3, 16); x11 += x15; x7 = Integer.rotateLeft(x7 ^ x11, 12);
                x3 += x7; x15 = Integer.rotateLeft(x15 ^ x3, 8); x11 += x15; x7 = Integer.rotateLeft(x7 ^ x11, 7);
                // Diagonal round.
                x0 += x5; x15 = Integer.rotateLeft(x15 ^ x0, 16); x10 += x15; x5 = Integer.rotateLeft(x5 ^ x10, 12);
                x0 += x5; x15 = Integer.rotateLeft(x15 ^ x0, 8); x10 += x15; x5 = Integer.rotateLeft(x5 ^ x10, 7);
                x1 += x6; x12 = Integer.rotateLeft(x12 ^ x1, 16); x11 += x12; x6 = Integer.rotateLeft(x6 ^ x11, 12);
                x1 += x6; x12 = Integer.rotateLeft(x12 ^ x1, 8); x11 += x12; x6 = Integer.rotateLeft(x6 ^ x11, 7);
                x2 += x7; x13 = Integer.rotateLeft(x13 ^ x2, 16); x8 += x13; x7 = Integer.rotateLeft(x7 ^ x8, 12);
                x2 += x7; x13 = Integer.rotateLeft(x13 ^ x2, 8); x8 += x13; x7 = Integer.rotateLeft(x7 ^ x8, 7);
                x3 += x4; x14 = Integer.rotateLeft(x14 ^ x3, 16); x9 += x14; x4 = Integer.rotateLeft(x4 ^ x9, 12);
                x3 += x4; x14 = Integer.rotateLeft(x14 ^ x3, 8); x9 += x14; x4 = Integer.rotateLeft(x4 ^ x9, 7);
            }
            x0 += C0; x1 += C1; x2 += C2; x3 += C3;
            x4 += k0; x5 += k1; x6 += k2; x7 += k3;
            x8 += k4; x9 += k5; x10 += k6; x11 += k7;
            x12 += blockCounter; x13 += nonce13; x14 += nonce14; x15 += nonce15;
            if (end - position >= BLOCK_BYTES) {
                xorLong(data, position, x0, x1);
                xorLong(data, position + 8, x2, x3);
                xorLong(data, position + 16, x4, x5);
                xorLong(data, position + 24, x6, x7);
                xorLong(data, position + 32, x8, x9);
                xorLong(data, position + 40, x10, x11);
                xorLong(data, position + 48, x12, x13);
                xorLong(data, position + 56, x14, x15);
                position += BLOCK_BYTES;
            } else {
                int tail = (int) (end - position);
                for (int i = 0; i < tail; i++) {
                    int word = switch (i >>> 2) {
                        case 0 -> x0; case 1 -> x1; case 2 -> x2; case 3 -> x3;
                        case 4 -> x4; case 5 -> x5; case 6 -> x6; case 7 -> x7;
                        case 8 -> x8; case 9 -> x9; case 10 -> x10; case 11 -> x11;
                        case 12 -> x12; case 13 -> x13; case 14 -> x14; default -> x15;
                    };
                    byte b = data.get(ValueLayout.JAVA_BYTE, position + i);
                    data.set(ValueLayout.JAVA_BYTE, position + i, (byte) (b ^ (word >>> ((i & 3) << 3))));
                }
                position = end;
            }
            blockCounter++;
        }
    }

    private static void xorLong(MemorySegment data, long position, int low, int high) {
        long keystream = (low & 0xFFFF_FFFFL) | ((long) high << 32);
        data.set(DATA_LONG, position, data.get(DATA_LONG, position) ^ keystream);
    }
}
