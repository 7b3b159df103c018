package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import dev.kvshield.cuda.kernel.KernelAbi;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HexFormat;
import org.junit.jupiter.api.Test;

/**
 * The chacha20-xor kernel (host build) against the RFC 8439 test vectors. Nonce words map to
 * (page, generation, buffer) and the block counter to the byte offset in the page region / 64,
 * so a vector with counter 1 is checked at offset 64 of the region. A vector's page index can be
 * any u32: the buffer base is placed so that {@code base + page * pageBytes} (mod 2^64) lands on
 * the test's memory.
 */
class ChaChaVectorsTest {
    private static final HexFormat HEX = HexFormat.of();
    private static final byte[] KEY_0_TO_31 = HEX.parseHex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");

    /** RFC 8439 2.3.2: block function, nonce 00000009 0000004a 00000000, counter 1. */
    private static final byte[] BLOCK_2_3_2 = HEX.parseHex("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
            + "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e");
    /** RFC 8439 2.4.2: encryption, nonce 00000000 0000004a 00000000, counter 1. */
    private static final byte[] PLAINTEXT_2_4_2 = ("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for "
            + "the future, sunscreen would be it.").getBytes(StandardCharsets.US_ASCII);
    private static final byte[] CIPHERTEXT_2_4_2 = HEX.parseHex("6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
            + "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
            + "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
            + "5af90bbf74a35be6b40b8eedf2785e42874d");
    /** RFC 8439 A.1 test vector 1: all-zero key and nonce, counter 0. */
    private static final byte[] BLOCK_A_1_1 = HEX.parseHex("76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
            + "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586");

    /**
     * XORs {@code data} placed at {@code offsetInPage} of the region of (page, buffer 0) with the
     * kernel's keystream under (key, page, generation) and returns the result.
     */
    private static byte[] xorThroughKernel(KernelLauncher launcher, byte[] key, int page, int generation, int offsetInPage,
            byte[] data) {
        int pageBytes = offsetInPage + data.length;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment region = arena.allocate(pageBytes, 64);
            MemorySegment.copy(MemorySegment.ofArray(data), 0, region, offsetInPage, data.length);
            MemorySegment bases = arena.allocateFrom(ValueLayout.JAVA_LONG,
                    region.address() - Integer.toUnsignedLong(page) * pageBytes);
            MemorySegment pageBytesTable = arena.allocateFrom(ValueLayout.JAVA_INT, pageBytes);
            MemorySegment entries = arena.allocateFrom(ValueLayout.JAVA_INT, page, generation, 0);
            MemorySegment keys = arena.allocate(KernelAbi.KEY_SLOTS_BYTES, 16);
            MemorySegment.copy(MemorySegment.ofArray(key), 0, keys, 0, KernelAbi.KEY_BYTES);
            int units = (pageBytes + KernelAbi.CHACHA_BLOCK_BYTES - 1) / KernelAbi.CHACHA_BLOCK_BYTES;
            launcher.chacha20Xor(2, 3, bases, pageBytesTable, 1, entries, 1, units, keys);
            return region.asSlice(offsetInPage, data.length).toArray(ValueLayout.JAVA_BYTE);
        }
    }

    @Test
    void blockFunctionVector232() {
        assertArrayEquals(BLOCK_2_3_2, xorThroughKernel(HostKernels.require(), KEY_0_TO_31, 0x09000000, 0x4a000000, 64, new byte[64]));
    }

    @Test
    void encryptionVector242AndItsInverse() {
        HostKernels kernels = HostKernels.require();
        assertArrayEquals(CIPHERTEXT_2_4_2, xorThroughKernel(kernels, KEY_0_TO_31, 0, 0x4a000000, 64, PLAINTEXT_2_4_2));
        assertArrayEquals(PLAINTEXT_2_4_2, xorThroughKernel(kernels, KEY_0_TO_31, 0, 0x4a000000, 64, CIPHERTEXT_2_4_2));
    }

    @Test
    void keystreamVectorA11() {
        assertArrayEquals(BLOCK_A_1_1, xorThroughKernel(HostKernels.require(), new byte[32], 0, 0, 0, new byte[64]));
    }

    @Test
    void plantedBugsMissTheVectors() {
        HostKernels kernels = HostKernels.require();
        assertFalse(Arrays.equals(CIPHERTEXT_2_4_2,
                xorThroughKernel(PlantedBugs.offByOnePageStride(kernels), KEY_0_TO_31, 0, 0x4a000000, 64, PLAINTEXT_2_4_2)));
        assertFalse(Arrays.equals(CIPHERTEXT_2_4_2,
                xorThroughKernel(PlantedBugs.skippedBuffer(kernels), KEY_0_TO_31, 0, 0x4a000000, 64, PLAINTEXT_2_4_2)));
    }

    @Test
    void hostBuildAndJavaAgreeOnTheKeySlotCount() {
        assertEquals(KernelAbi.MAX_KEY_SLOTS, HostKernels.require().maxKeys());
    }
}
