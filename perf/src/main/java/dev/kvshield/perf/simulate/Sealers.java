package dev.kvshield.perf.simulate;

import dev.kvshield.KvShieldException;
import dev.kvshield.cuda.seal.CudaPageSealerFactory;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.MemorySegment;

/**
 * The ENCRYPT key source of the lab and the raw cipher its seal bandwidth is compared with, both
 * from tenant-keys. The lab's key source is an ephemeral root key (fresh random bytes per JVM,
 * never written anywhere): the lab measures, it keeps nothing.
 */
public final class Sealers {
    private Sealers() {}

    /** The raw page cipher: XORs the keystream of (key, nonce words, block counter) over {@code data} in place. */
    @FunctionalInterface
    public interface RawCipher {
        void xor(MemorySegment key, int[] nonceWords, long counter, MemorySegment data);
    }

    /** tenant-keys' CPU sealer over an ephemeral root key, or why it cannot be built. */
    public static Availability<PageSealerFactory> hostSealer() {
        try {
            return Availability.of(new HostPageSealerFactory(RootKeySource.ephemeral()));
        } catch (KvShieldException e) {
            return Availability.unavailable("tenant-keys could not open an ephemeral root key: " + e.getMessage());
        }
    }

    /** cuda-scrub's GPU sealer (the same keys and keystream layout) over an ephemeral root key. */
    public static Availability<PageSealerFactory> cudaSealer() {
        try {
            return Availability.of(new CudaPageSealerFactory(RootKeySource.ephemeral()));
        } catch (KvShieldException e) {
            return Availability.unavailable("tenant-keys could not open an ephemeral root key: " + e.getMessage());
        }
    }

    /** tenant-keys' raw ChaCha20 (RFC 8439), the limit ENCRYPT's seal is compared with. */
    public static RawCipher rawChaCha20() {
        return ChaCha20::xor;
    }
}
