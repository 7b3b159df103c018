package dev.kvshield.keys.internal;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import org.bouncycastle.crypto.digests.SHA256Digest;
import org.bouncycastle.crypto.macs.HMac;
import org.bouncycastle.crypto.params.KeyParameter;

/**
 * HKDF-SHA256 (RFC 5869) from Bouncy Castle's HMAC, reading the input key from off-heap memory and
 * writing the output key to off-heap memory.
 *
 * <p>Implementation notes: Bouncy Castle's {@code HKDFBytesGenerator} keeps private copies of the
 * input key and the pseudo-random key that a caller cannot wipe; built from {@link HMac} directly,
 * every heap copy of key material (the input key's staging array, the PRK, each output block and
 * HMAC's key pads) is zeroed before returning. Tests check the output against
 * {@code HKDFBytesGenerator} and the RFC 5869 vectors.
 */
public final class Hkdf {
    private static final int HASH_BYTES = 32;
    private static final byte[] ZERO_KEY = new byte[HASH_BYTES];

    private Hkdf() {}

    /**
     * Derives {@code out.byteSize()} bytes (at most {@code 255 * 32}) of HKDF-SHA256 output.
     *
     * @param ikm the input key material, read and never copied anywhere that is not wiped
     */
    public static void deriveSha256(MemorySegment ikm, byte[] salt, byte[] info, MemorySegment out) {
        long length = out.byteSize();
        if (length <= 0 || length > 255L * HASH_BYTES) {
            throw new IllegalArgumentException("HKDF-SHA256 derives 1.." + 255 * HASH_BYTES + " bytes, asked for " + length);
        }
        HMac hmac = new HMac(new SHA256Digest());
        byte[] staging = ikm.toArray(ValueLayout.JAVA_BYTE);
        byte[] prk = new byte[HASH_BYTES];
        byte[] block = new byte[HASH_BYTES];
        KeyParameter prkParameter = null;
        try {
            hmac.init(new KeyParameter(salt));
            hmac.update(staging, 0, staging.length);
            hmac.doFinal(prk, 0);
            prkParameter = new KeyParameter(prk);
            long written = 0;
            for (int i = 1; written < length; i++) {
                hmac.init(prkParameter);
                if (i > 1) {
                    hmac.update(block, 0, HASH_BYTES);
                }
                hmac.update(info, 0, info.length);
                hmac.update((byte) i);
                hmac.doFinal(block, 0);
                int n = (int) Math.min(HASH_BYTES, length - written);
                MemorySegment.copy(block, 0, out, ValueLayout.JAVA_BYTE, written, n);
                written += n;
            }
        } finally {
            Arrays.fill(staging, (byte) 0);
            Arrays.fill(prk, (byte) 0);
            Arrays.fill(block, (byte) 0);
            if (prkParameter != null) {
                // KeyParameter holds its own copy of the PRK; getKey() exposes that copy.
                Arrays.fill(prkParameter.getKey(), (byte) 0);
            }
            // Re-keying overwrites HMAC's key-derived pads and digest states.
            hmac.init(new KeyParameter(ZERO_KEY));
        }
    }
}
