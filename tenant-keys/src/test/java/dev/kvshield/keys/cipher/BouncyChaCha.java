package dev.kvshield.keys.cipher;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.bouncycastle.crypto.engines.ChaCha7539Engine;
import org.bouncycastle.crypto.params.KeyParameter;
import org.bouncycastle.crypto.params.ParametersWithIV;

/** The reference: Bouncy Castle's RFC 8439 engine, driven with our nonce words and block counter. */
public final class BouncyChaCha {
    private BouncyChaCha() {}

    /** XORs the keystream of (key, nonce words, first block counter) into {@code data} in place. */
    public static void xor(byte[] key, int nonce13, int nonce14, int nonce15, long counter, byte[] data) {
        byte[] nonce = ByteBuffer.allocate(12).order(ByteOrder.LITTLE_ENDIAN).putInt(nonce13).putInt(nonce14).putInt(nonce15).array();
        ChaCha7539Engine engine = new ChaCha7539Engine();
        engine.init(true, new ParametersWithIV(new KeyParameter(key), nonce));
        engine.skip(counter * ChaCha20.BLOCK_BYTES);
        engine.processBytes(data, 0, data.length, data, 0);
    }

    /** The keystream bytes of (key, nonce words, counter) for {@code lengthBytes} bytes. */
    public static byte[] keystream(byte[] key, int nonce13, int nonce14, int nonce15, long counter, int lengthBytes) {
        byte[] data = new byte[lengthBytes];
        xor(key, nonce13, nonce14, nonce15, counter, data);
        return data;
    }
}
