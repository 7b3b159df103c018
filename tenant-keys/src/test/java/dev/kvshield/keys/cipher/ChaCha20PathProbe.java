package dev.kvshield.keys.cipher;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HexFormat;

/**
 * Run in a child JVM by {@link ChaCha20FallbackTest}: prints {@link ChaCha20#implementation()} and,
 * on the next line, the hex of a zeroed segment after {@link ChaCha20#xor} of {@link #LENGTH} bytes
 * at offset {@link #OFFSET} (sequential key, {@link #COUNTER}, nonce words 13-15 = 1, 2, 3).
 */
final class ChaCha20PathProbe {
    /** Three 16-block groups and a partial block: every wide path's groups and the scalar remainder. */
    static final int LENGTH = 3 * 16 * ChaCha20.BLOCK_BYTES + 37;
    static final int OFFSET = 3;
    /** The blocks cross 2^31, where the wide paths' int lane counters turn negative. */
    static final long COUNTER = (1L << 31) - 20;

    private ChaCha20PathProbe() {}

    public static void main(String[] args) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(ChaCha20.KEY_BYTES);
            for (int i = 0; i < ChaCha20.KEY_BYTES; i++) {
                key.set(ValueLayout.JAVA_BYTE, i, (byte) i);
            }
            MemorySegment data = arena.allocate(OFFSET + LENGTH + OFFSET);
            ChaCha20.xor(key, 1, 2, 3, COUNTER, data, OFFSET, LENGTH);
            System.out.println(ChaCha20.implementation());
            System.out.println(HexFormat.of().formatHex(data.toArray(ValueLayout.JAVA_BYTE)));
        }
    }
}
