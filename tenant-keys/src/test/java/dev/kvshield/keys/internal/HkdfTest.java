package dev.kvshield.keys.internal;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HexFormat;
import java.util.SplittableRandom;
import org.bouncycastle.crypto.digests.SHA256Digest;
import org.bouncycastle.crypto.generators.HKDFBytesGenerator;
import org.bouncycastle.crypto.params.HKDFParameters;
import org.junit.jupiter.api.Test;

/** HKDF-SHA256 against RFC 5869 and Bouncy Castle's own HKDF generator. */
class HkdfTest {
    private static final HexFormat HEX = HexFormat.of();

    private static byte[] derive(byte[] ikm, byte[] salt, byte[] info, int length) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment in = arena.allocate(Math.max(1, ikm.length)).asSlice(0, ikm.length);
            MemorySegment.copy(ikm, 0, in, ValueLayout.JAVA_BYTE, 0, ikm.length);
            MemorySegment out = arena.allocate(length);
            Hkdf.deriveSha256(in, salt, info, out);
            return out.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    private static byte[] bouncy(byte[] ikm, byte[] salt, byte[] info, int length) {
        HKDFBytesGenerator generator = new HKDFBytesGenerator(new SHA256Digest());
        generator.init(new HKDFParameters(ikm, salt, info));
        byte[] out = new byte[length];
        generator.generateBytes(out, 0, length);
        return out;
    }

    @Test
    void rfc5869TestCase1() {
        byte[] okm = derive(HEX.parseHex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"), HEX.parseHex("000102030405060708090a0b0c"),
                HEX.parseHex("f0f1f2f3f4f5f6f7f8f9"), 42);
        assertEquals("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865", HEX.formatHex(okm));
    }

    @Test
    void agreesWithBouncyCastleHkdfForManyInputsAndLengths() {
        SplittableRandom random = new SplittableRandom(5869);
        for (int trial = 0; trial < 200; trial++) {
            byte[] ikm = bytes(random, 1 + random.nextInt(80));
            byte[] salt = bytes(random, random.nextInt(40));
            byte[] info = bytes(random, random.nextInt(120));
            int length = 1 + random.nextInt(200);
            assertArrayEquals(bouncy(ikm, salt, info, length), derive(ikm, salt, info, length), "trial " + trial);
        }
    }

    @Test
    void refusesLengthsHkdfCannotProduce() {
        assertThrows(IllegalArgumentException.class, () -> derive(new byte[32], new byte[0], new byte[0], 255 * 32 + 1));
    }

    private static byte[] bytes(SplittableRandom random, int n) {
        byte[] b = new byte[n];
        for (int i = 0; i < n; i++) {
            b[i] = (byte) random.nextInt(256);
        }
        return b;
    }
}
