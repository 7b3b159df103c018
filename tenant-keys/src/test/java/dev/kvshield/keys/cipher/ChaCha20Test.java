package dev.kvshield.keys.cipher;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/** ChaCha20 against RFC 8439's vectors and, byte for byte, against Bouncy Castle's engine. */
class ChaCha20Test {
    private static final HexFormat HEX = HexFormat.of();

    private static byte[] sequentialKey() {
        byte[] key = new byte[32];
        for (int i = 0; i < 32; i++) {
            key[i] = (byte) i;
        }
        return key;
    }

    private static int[] nonceWords(String nonceHex) {
        ByteBuffer b = ByteBuffer.wrap(HEX.parseHex(nonceHex)).order(ByteOrder.LITTLE_ENDIAN);
        return new int[] {b.getInt(), b.getInt(), b.getInt()};
    }

    private static byte[] xorWithOurs(byte[] key, int[] nonce, long counter, byte[] data) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment k = arena.allocate(32);
            MemorySegment.copy(key, 0, k, ValueLayout.JAVA_BYTE, 0, 32);
            MemorySegment d = arena.allocate(Math.max(1, data.length)).asSlice(0, data.length);
            MemorySegment.copy(data, 0, d, ValueLayout.JAVA_BYTE, 0, data.length);
            ChaCha20.xor(k, nonce, counter, d);
            return d.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    @Test
    void rfc8439Section232BlockFunction() {
        byte[] block = xorWithOurs(sequentialKey(), nonceWords("000000090000004a00000000"), 1, new byte[64]);
        assertEquals("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
                + "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e", HEX.formatHex(block));
    }

    @Test
    void rfc8439Section242Encryption() {
        byte[] plaintext = ("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future,"
                + " sunscreen would be it.").getBytes(StandardCharsets.US_ASCII);
        byte[] ciphertext = xorWithOurs(sequentialKey(), nonceWords("000000000000004a00000000"), 1, plaintext);
        assertEquals("6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
                + "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
                + "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
                + "5af90bbf74a35be6b40b8eedf2785e42874d", HEX.formatHex(ciphertext));
        assertArrayEquals(plaintext, xorWithOurs(sequentialKey(), nonceWords("000000000000004a00000000"), 1, ciphertext));
    }

    @Test
    void rfc8439AppendixA1KeystreamVectors() {
        byte[] zeroKey = new byte[32];
        assertEquals("76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
                + "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586",
                HEX.formatHex(xorWithOurs(zeroKey, new int[3], 0, new byte[64])));
        assertEquals("9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
                + "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f",
                HEX.formatHex(xorWithOurs(zeroKey, new int[3], 1, new byte[64])));
    }

    @Test
    void agreesWithBouncyCastleOverManyLengthsOffsetsCountersAndNonces() {
        SplittableRandom random = new SplittableRandom(0x5EED_C4A2L);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(32);
            MemorySegment buffer = arena.allocate(70_000);
            for (int trial = 0; trial < 400; trial++) {
                byte[] keyBytes = bytes(random, 32);
                MemorySegment.copy(keyBytes, 0, key, ValueLayout.JAVA_BYTE, 0, 32);
                int length = trial < 130 ? trial : random.nextInt(65_000);
                int offset = random.nextInt(64);
                long counter = random.nextBoolean() ? random.nextInt(1000) : (1L << 32) - 1 - (length + 63) / 64;
                int n13 = random.nextInt(), n14 = random.nextInt(), n15 = random.nextInt();
                byte[] plain = bytes(random, length);
                MemorySegment.copy(plain, 0, buffer, ValueLayout.JAVA_BYTE, offset, length);
                byte guardBefore = buffer.get(ValueLayout.JAVA_BYTE, Math.max(0, offset - 1));
                byte guardAfter = buffer.get(ValueLayout.JAVA_BYTE, offset + length);
                ChaCha20.xor(key, n13, n14, n15, counter, buffer, offset, length);
                BouncyChaCha.xor(keyBytes, n13, n14, n15, counter, plain);
                byte[] ours = buffer.asSlice(offset, length).toArray(ValueLayout.JAVA_BYTE);
                assertArrayEquals(plain, ours, "trial " + trial + " length " + length + " offset " + offset + " counter " + counter);
                if (offset > 0) {
                    assertEquals(guardBefore, buffer.get(ValueLayout.JAVA_BYTE, offset - 1), "byte before the range changed");
                }
                assertEquals(guardAfter, buffer.get(ValueLayout.JAVA_BYTE, offset + length), "byte after the range changed");
            }
        }
    }

    @Test
    void agreesWithBouncyCastleAroundGroupEdgesAtOddOffsets() {
        // Lengths one byte and one block either side of whole wide groups (8 blocks = 512 bytes), so the
        // scalar remainder starts at every position of a block, at offsets that misalign every access.
        int group = VectorChaCha20.LANES * ChaCha20.BLOCK_BYTES;
        int[] lengths = {group - 1, group, group + 1, group - 64, group + 64, 2 * group - 1, 2 * group + 63, 3 * group + 7};
        int[] offsets = {0, 1, 3, 7, 31, 33, 63};
        SplittableRandom random = new SplittableRandom(0xED6E);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(32);
            MemorySegment buffer = arena.allocate(4 * group + 128);
            for (int length : lengths) {
                for (int offset : offsets) {
                    byte[] keyBytes = bytes(random, 32);
                    MemorySegment.copy(keyBytes, 0, key, ValueLayout.JAVA_BYTE, 0, 32);
                    long counter = random.nextInt(1 << 20);
                    assertSameAsBouncyCastle(key, keyBytes, buffer, offset, length, counter, random);
                }
            }
        }
    }

    @Test
    void agreesWithBouncyCastleForCountersNearTwoToThe32() {
        // Groups whose lanes cross from signed-positive to negative ints (2^31) and groups that end
        // exactly on the last counter 2^32 - 1: the wide path's lane counters are int arithmetic.
        int group = VectorChaCha20.LANES * ChaCha20.BLOCK_BYTES;
        SplittableRandom random = new SplittableRandom(0x2_32);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(32);
            MemorySegment buffer = arena.allocate(4 * group + 128);
            byte[] keyBytes = bytes(random, 32);
            MemorySegment.copy(keyBytes, 0, key, ValueLayout.JAVA_BYTE, 0, 32);
            for (int length : new int[] {group, 3 * group, 3 * group + 100, 2 * group - 5}) {
                long blocks = (length + 63) / 64;
                for (long counter : new long[] {(1L << 31) - 3, (1L << 31) - blocks, (1L << 32) - blocks, (1L << 32) - blocks - 1}) {
                    assertSameAsBouncyCastle(key, keyBytes, buffer, 5, length, counter, random);
                }
                // One block more than fits is refused, nothing changed.
                long tooFar = (1L << 32) - blocks + 1;
                buffer.fill((byte) 0x5A);
                assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(key, 1, 2, 3, tooFar, buffer, 5, length));
                for (long i = 0; i < buffer.byteSize(); i++) {
                    assertEquals(0x5A, buffer.get(ValueLayout.JAVA_BYTE, i), "byte " + i + " changed by a refused call");
                }
            }
        }
    }

    /**
     * The JDK's intrinsic is used only from C2-compiled code (interpreted, its block function makes
     * one block per call; compiled on AVX2, four): calls long enough for on-stack compilation, many
     * of them, so the compiled stub's output is what is compared with the scalar code.
     */
    @Test
    void jdkPathAgreesWithTheScalarPathOnceCompiledAndLeavesNoKeyOrKeystream() {
        assertTrue(JdkChaCha20.AVAILABLE, "test JVMs open java.base/com.sun.crypto.provider (kvshield.testArgLine)");
        SplittableRandom random = new SplittableRandom(0x1D4);
        int length = 256 * 1024 + 37;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment fast = arena.allocate(length + 3);
            MemorySegment scalar = arena.allocate(length + 3);
            for (int trial = 0; trial < 40; trial++) {
                byte[] plain = bytes(random, length + 3);
                MemorySegment.copy(plain, 0, fast, ValueLayout.JAVA_BYTE, 0, plain.length);
                MemorySegment.copy(plain, 0, scalar, ValueLayout.JAVA_BYTE, 0, plain.length);
                int[] k = random.ints(8).toArray();
                int counter = trial % 2 == 0 ? random.nextInt(1 << 20) : Integer.MAX_VALUE - 100;
                int n13 = random.nextInt(), n14 = random.nextInt(), n15 = random.nextInt();
                int len = trial < 20 ? length : random.nextInt(length);
                JdkChaCha20.xor(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], n13, n14, n15, counter, fast, 3, 3 + len);
                ChaCha20.xorScalar(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], n13, n14, n15, counter, scalar, 3, 3 + len);
                assertArrayEquals(scalar.toArray(ValueLayout.JAVA_BYTE), fast.toArray(ValueLayout.JAVA_BYTE),
                        "trial " + trial + " length " + len + " counter " + counter);
            }
            assertArrayEquals(new int[16], JdkChaCha20.STATE.get(), "key words left in the per-thread state");
            byte[] keystream = JdkChaCha20.KEYSTREAM.get();
            assertArrayEquals(new byte[keystream.length], keystream, "keystream left in the per-thread scratch");
        }
    }

    /** The 8-lane path runs where the JDK's block function cannot; called directly it is checked against the scalar code. */
    @Test
    void eightLanePathAgreesWithTheScalarPathAndLeavesNoKeystream() {
        assertWidePathAgreesWithScalar(VectorChaCha20.LANES, VectorChaCha20.KEYSTREAM,
                (k, counter, data, groups) -> VectorChaCha20.xorGroups(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 9, 8, 7,
                        counter, data, 5, groups));
    }

    /**
     * The 16-lane path runs only on AVX-512 CPUs without the JDK's block function; called directly it
     * runs anywhere (the Vector API emulates 512-bit vectors), so it is checked against the scalar
     * code here too.
     */
    @Test
    void sixteenLanePathAgreesWithTheScalarPathAndLeavesNoKeystream() {
        assertWidePathAgreesWithScalar(GatheredChaCha20.LANES, GatheredChaCha20.KEYSTREAM,
                (k, counter, data, groups) -> GatheredChaCha20.xorGroups(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 9, 8, 7,
                        counter, data, 5, groups));
    }

    private interface WidePath {
        void xorGroups(int[] key, int counter, MemorySegment data, long groups);
    }

    private static void assertWidePathAgreesWithScalar(int lanes, ThreadLocal<int[]> keystreamScratch, WidePath path) {
        SplittableRandom random = new SplittableRandom(lanes);
        int groups = 3;
        int length = groups * lanes * ChaCha20.BLOCK_BYTES;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment wide = arena.allocate(length + 5);
            MemorySegment scalar = arena.allocate(length + 5);
            byte[] plain = bytes(random, length + 5);
            MemorySegment.copy(plain, 0, wide, ValueLayout.JAVA_BYTE, 0, plain.length);
            MemorySegment.copy(plain, 0, scalar, ValueLayout.JAVA_BYTE, 0, plain.length);
            int[] k = random.ints(8).toArray();
            int counter = (1 << 30) - 7;
            path.xorGroups(k, counter, wide, groups);
            ChaCha20.xorScalar(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 9, 8, 7, counter, scalar, 5, 5 + length);
            assertArrayEquals(scalar.toArray(ValueLayout.JAVA_BYTE), wide.toArray(ValueLayout.JAVA_BYTE));
            int[] scratch = keystreamScratch.get();
            assertArrayEquals(new int[scratch.length], scratch, "keystream left in the " + lanes + "-lane path's scratch");
        }
    }

    /**
     * A write that fails midway (a read-only segment, or its arena closed, possibly by another thread
     * during the call) must not leave the group's keystream, or the JDK path's key words, in the
     * per-thread scratch: every path zeroes it however the call ends.
     */
    @Test
    void everyPathLeavesNoKeyOrKeystreamWhenTheWriteFails() {
        int length = 2 * GatheredChaCha20.LANES * ChaCha20.BLOCK_BYTES;
        Arena closed = Arena.ofConfined();
        MemorySegment closedData = closed.allocate(length);
        closed.close();
        try (Arena arena = Arena.ofConfined()) {
            for (MemorySegment data : new MemorySegment[] {arena.allocate(length).asReadOnly(), closedData}) {
                RuntimeException e = assertThrows(RuntimeException.class,
                        () -> VectorChaCha20.xorGroups(1, 2, 3, 4, 5, 6, 7, 8, 9, 8, 7, 0, data, 0, 2));
                assertArrayEquals(new int[16 * VectorChaCha20.LANES], VectorChaCha20.KEYSTREAM.get(), "8-lane scratch after " + e);
                e = assertThrows(RuntimeException.class,
                        () -> GatheredChaCha20.xorGroups(1, 2, 3, 4, 5, 6, 7, 8, 9, 8, 7, 0, data, 0, 2));
                assertArrayEquals(new int[16 * GatheredChaCha20.LANES], GatheredChaCha20.KEYSTREAM.get(), "16-lane scratch after " + e);
                e = assertThrows(RuntimeException.class, () -> JdkChaCha20.xor(1, 2, 3, 4, 5, 6, 7, 8, 9, 8, 7, 0, data, 0, length));
                assertArrayEquals(new int[16], JdkChaCha20.STATE.get(), "JDK path state after " + e);
                byte[] keystream = JdkChaCha20.KEYSTREAM.get();
                assertArrayEquals(new byte[keystream.length], keystream, "JDK path keystream after " + e);
            }
        }
    }

    @Test
    void testJvmsRunTheJdkPath() {
        // kvshield.testArgLine opens the JDK's ChaCha20 to every test JVM, so the tests above cover the path serving uses.
        assertEquals("jdk", ChaCha20.implementation());
    }

    @Test
    void scalarPathAloneAgreesWithBouncyCastle() {
        SplittableRandom random = new SplittableRandom(8439);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment buffer = arena.allocate(20_000);
            for (int trial = 0; trial < 100; trial++) {
                byte[] keyBytes = bytes(random, 32);
                ByteBuffer words = ByteBuffer.wrap(keyBytes).order(ByteOrder.LITTLE_ENDIAN);
                int[] k = new int[8];
                for (int i = 0; i < 8; i++) {
                    k[i] = words.getInt();
                }
                int length = random.nextInt(20_000);
                int counter = random.nextInt(1 << 20);
                byte[] plain = bytes(random, length);
                MemorySegment.copy(plain, 0, buffer, ValueLayout.JAVA_BYTE, 0, length);
                ChaCha20.xorScalar(k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], 11, 22, trial, counter, buffer, 0, length);
                BouncyChaCha.xor(keyBytes, 11, 22, trial, counter, plain);
                assertArrayEquals(plain, buffer.asSlice(0, length).toArray(ValueLayout.JAVA_BYTE), "trial " + trial);
            }
        }
    }

    @Test
    void refusesACounterThatWouldWrapAndChangesNothing() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(32);
            MemorySegment data = arena.allocate(129);
            data.fill((byte) 7);
            long lastCounter = (1L << 32) - 1;
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> ChaCha20.xor(key, 1, 2, 3, lastCounter - 1, data, 0, 129));
            assertTrue(e.getMessage().contains("wrap") && e.getMessage().contains(Long.toString(lastCounter - 1)), e.getMessage());
            assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(key, 1, 2, 3, 1L << 32, data, 0, 0));
            assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(key, 1, 2, 3, -1, data, 0, 1));
            for (long i = 0; i < data.byteSize(); i++) {
                assertEquals(7, data.get(ValueLayout.JAVA_BYTE, i), "byte " + i + " changed by a refused call");
            }
            // Exactly reaching the last counter value is allowed: 2 blocks from 2^32 - 2.
            ChaCha20.xor(key, 1, 2, 3, lastCounter - 1, data, 0, 128);
        }
    }

    /**
     * A range of more than 2^32 blocks is refused whatever its length: lengths near {@code Long.MAX_VALUE}
     * (a segment reinterpreted that large) must not overflow the block count into an accepted call. The
     * segment is read-only, so a call that got past the checks fails on its first write instead of
     * running off the end of the real memory.
     */
    @Test
    void refusesRangesOfMoreThanTwoToThe32BlocksEvenNearLongMax() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocate(32);
            MemorySegment huge = arena.allocate(64).reinterpret(Long.MAX_VALUE).asReadOnly();
            for (long length : new long[] {Long.MAX_VALUE, Long.MAX_VALUE - 62, Long.MAX_VALUE - 63, ChaCha20.MAX_BYTES_PER_NONCE + 1}) {
                IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                        () -> ChaCha20.xor(key, 1, 2, 3, 0, huge, 0, length));
                assertTrue(e.getMessage().contains("wrap"), e.getMessage());
            }
        }
    }

    @Test
    void refusesBadKeySizeNonceLengthAndRanges() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment data = arena.allocate(64);
            assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(arena.allocate(16), new int[3], 0, data));
            assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(arena.allocate(32), new int[2], 0, data));
            assertThrows(IllegalArgumentException.class, () -> ChaCha20.xor(arena.allocate(32), 0, 0, 0, 0, data, 60, 8));
            // The message names the values given, not an overflowed end.
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> ChaCha20.xor(arena.allocate(32), 0, 0, 0, 0, data, 10, Long.MAX_VALUE));
            assertTrue(e.getMessage().contains("10") && e.getMessage().contains(Long.toString(Long.MAX_VALUE)), e.getMessage());
        }
    }

    private static void assertSameAsBouncyCastle(MemorySegment key, byte[] keyBytes, MemorySegment buffer, int offset, int length,
            long counter, SplittableRandom random) {
        int n13 = random.nextInt(), n14 = random.nextInt(), n15 = random.nextInt();
        byte[] plain = bytes(random, length);
        buffer.fill((byte) 0x77);
        MemorySegment.copy(plain, 0, buffer, ValueLayout.JAVA_BYTE, offset, length);
        ChaCha20.xor(key, n13, n14, n15, counter, buffer, offset, length);
        if (counter + (length + 63) / 64 < 1L << 32) {
            BouncyChaCha.xor(keyBytes, n13, n14, n15, counter, plain);
        } else {
            // Bouncy Castle refuses to use the last counter value 2^32 - 1; the scalar path (checked
            // against Bouncy Castle above and below that value) is the reference there.
            ByteBuffer words = ByteBuffer.wrap(keyBytes).order(ByteOrder.LITTLE_ENDIAN);
            ChaCha20.xorScalar(words.getInt(), words.getInt(), words.getInt(), words.getInt(), words.getInt(), words.getInt(),
                    words.getInt(), words.getInt(), n13, n14, n15, (int) counter, MemorySegment.ofArray(plain), 0, length);
        }
        String where = "length " + length + " offset " + offset + " counter " + counter;
        assertArrayEquals(plain, buffer.asSlice(offset, length).toArray(ValueLayout.JAVA_BYTE), where);
        for (long i = 0; i < buffer.byteSize(); i++) {
            if (i < offset || i >= offset + length) {
                assertEquals(0x77, buffer.get(ValueLayout.JAVA_BYTE, i), "byte " + i + " outside the range changed, " + where);
            }
        }
    }

    private static byte[] bytes(SplittableRandom random, int n) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) {
            b[i] = (byte) random.nextInt(256);
        }
        return b;
    }
}
