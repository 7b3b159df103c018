package dev.kvshield.keys.cipher;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteOrder;
import java.util.Arrays;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorSpecies;

/**
 * The fastest path of {@link ChaCha20} where it can run: the JDK's own ChaCha20 block function
 * ({@code com.sun.crypto.provider.ChaCha20Cipher.implChaCha20Block}), which HotSpot replaces with
 * a hand-written vector stub (AVX2 / AVX-512 on x86, ASIMD on AArch64). Only {@link ChaCha20} calls
 * it, and only when the Vector API module is loaded (the XOR uses it) and {@link #AVAILABLE}; the
 * caller checked ranges and counter wrap. Thread-safe (per-thread scratch); allocates nothing per
 * call once compiled.
 *
 * <p>{@link #AVAILABLE} when the JVM opened {@code java.base/com.sun.crypto.provider} to this code
 * ({@code --add-opens java.base/com.sun.crypto.provider=ALL-UNNAMED}, which every JVM this project
 * starts passes) and the JDK has the method. HotSpot intrinsifies it on every x86 CPU with AVX and
 * every AArch64 CPU with ASIMD; elsewhere it is the JDK's plain Java, about as fast as the scalar
 * code {@link ChaCha20} would run there (its vector paths need 256-bit vectors, hence AVX2). Where
 * it is not available (not opened, another JVM, a future JDK without the method), {@link ChaCha20}
 * takes its own vector or scalar path; the bytes are the same on every path (RFC 8439).
 *
 * <p>Implementation notes. The block function fills a per-thread {@code byte[]} with as many
 * keystream blocks as the stub makes per call (its return value: 4 blocks on AVX2, 1 when not yet
 * compiled; never more than the JDK's own buffer, {@code KS_MAX_LEN}, whose size this scratch takes)
 * from a per-thread {@code int[16]} state whose words 4-11 are the key; the keystream is then XORed
 * into the data a preferred-width vector at a time (through longs instead, the whole path ran at
 * 0.78 GB/s instead of 1.03 on this project's VM). Both scratch arrays are zeroed before
 * {@link #xor} returns: key words or leftover keystream must not stay on the heap (until C2
 * compiles this XOR the Vector API boxes its vectors, keystream included, in heap objects; see
 * {@link ChaCha20}). Why not the JDK's public {@code Cipher}: it allocates per {@code init} (one
 * per page nonce), copies the key into heap objects that live as long as the cipher, and works on
 * heap arrays, so native pages would be copied twice. Measured on the project's 2-vCPU AMD EPYC
 * Zen 1 VM (AVX2, 2 GHz), 2 MiB per call, same JVM: 1.03 GB/s against 0.74 GB/s for
 * {@link VectorChaCha20} (x1.4), close to OpenSSL's hand-written AVX2 (~1.0 GB/s) on the same VM.
 */
final class JdkChaCha20 {
    /** The JDK's block function, or null where this JVM does not let us reach it. */
    private static final MethodHandle BLOCK;
    /**
     * The JDK's own keystream buffer size (its {@code KS_MAX_LEN}), read with the block function: its
     * stubs write up to that many bytes without a bounds check, so this scratch is never smaller.
     */
    private static final int KEYSTREAM_BYTES;
    /** True when {@link ChaCha20} should take this path (see the class notes). */
    static final boolean AVAILABLE;
    private static final int COUNTER_WORD = 12;
    private static final VectorSpecies<Byte> XOR_SPECIES = ByteVector.SPECIES_PREFERRED;

    static {
        MethodHandle block = null;
        int keystreamBytes = 0;
        try {
            Class<?> cipher = Class.forName("com.sun.crypto.provider.ChaCha20Cipher");
            MethodHandles.Lookup lookup = MethodHandles.privateLookupIn(cipher, MethodHandles.lookup());
            keystreamBytes = (int) lookup.findStaticVarHandle(cipher, "KS_MAX_LEN", int.class).get();
            block = lookup.findStatic(cipher, "implChaCha20Block", MethodType.methodType(int.class, int[].class, byte[].class));
        } catch (ReflectiveOperationException | RuntimeException e) {
            // NOTE: not opened to us, or a JDK without these members: ChaCha20 takes its own paths
            block = null;
        }
        boolean wholeBlocks = keystreamBytes >= ChaCha20.BLOCK_BYTES && keystreamBytes % ChaCha20.BLOCK_BYTES == 0;
        BLOCK = wholeBlocks ? block : null;
        KEYSTREAM_BYTES = keystreamBytes;
        AVAILABLE = BLOCK != null;
    }

    /** Per-thread block-function state; all zero between calls. */
    static final ThreadLocal<int[]> STATE = ThreadLocal.withInitial(() -> new int[16]);
    /** Per-thread keystream; all zero between calls. */
    static final ThreadLocal<byte[]> KEYSTREAM = ThreadLocal.withInitial(() -> new byte[KEYSTREAM_BYTES]);

    private JdkChaCha20() {}

    /**
     * XORs the keystream of blocks {@code counter, counter + 1, ...} into {@code data[position, end)};
     * the caller checked ranges and counter wrap. The last block may be partial.
     */
    static void xor(int k0, int k1, int k2, int k3, int k4, int k5, int k6, int k7, int nonce13, int nonce14, int nonce15,
            int counter, MemorySegment data, long position, long end) {
        int[] state = STATE.get();
        byte[] keystream = KEYSTREAM.get();
        state[0] = 0x61707865;
        state[1] = 0x3320646e;
        state[2] = 0x79622d32;
        state[3] = 0x6b206574;
        state[4] = k0;
        state[5] = k1;
        state[6] = k2;
        state[7] = k3;
        state[8] = k4;
        state[9] = k5;
        state[10] = k6;
        state[11] = k7;
        state[COUNTER_WORD] = counter;
        state[13] = nonce13;
        state[14] = nonce14;
        state[15] = nonce15;
        try {
            while (position < end) {
                int made = blocks(state, keystream);
                state[COUNTER_WORD] += made / ChaCha20.BLOCK_BYTES;
                int n = (int) Math.min(made, end - position);
                int i = 0;
                for (; i + XOR_SPECIES.length() <= n; i += XOR_SPECIES.length()) {
                    long p = position + i;
                    ByteVector.fromMemorySegment(XOR_SPECIES, data, p, ByteOrder.LITTLE_ENDIAN)
                            .lanewise(VectorOperators.XOR, ByteVector.fromArray(XOR_SPECIES, keystream, i))
                            .intoMemorySegment(data, p, ByteOrder.LITTLE_ENDIAN);
                }
                for (; i < n; i++) {
                    long p = position + i;
                    data.set(ValueLayout.JAVA_BYTE, p, (byte) (data.get(ValueLayout.JAVA_BYTE, p) ^ keystream[i]));
                }
                position += n;
            }
        } finally {
            // Key words and leftover keystream would decrypt pages: never leave them on the heap.
            Arrays.fill(state, 0);
            Arrays.fill(keystream, (byte) 0);
        }
    }

    private static int blocks(int[] state, byte[] keystream) {
        int made;
        try {
            made = (int) BLOCK.invokeExact(state, keystream);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            // NOTE: the JDK's block function declares no checked exception; a method handle's signature does
            throw new IllegalStateException("the JDK's ChaCha20 block function failed", t);
        }
        if (made <= 0 || made % ChaCha20.BLOCK_BYTES != 0 || made > keystream.length) {
            throw new IllegalStateException("the JDK's ChaCha20 block function made " + made + " keystream bytes; expected whole "
                    + ChaCha20.BLOCK_BYTES + "-byte blocks, at most " + keystream.length);
        }
        return made;
    }
}
