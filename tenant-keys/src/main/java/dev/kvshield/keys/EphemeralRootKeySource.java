package dev.kvshield.keys;

import java.lang.foreign.MemorySegment;
import java.security.SecureRandom;

/**
 * {@link RootKeySource#ephemeral}: one random key per source, generated on first load and logged
 * once as a development key; every {@link #load()} returns an off-heap copy of it.
 */
final class EphemeralRootKeySource implements RootKeySource {
    private static final System.Logger LOG = System.getLogger(EphemeralRootKeySource.class.getName());

    private RootKey key; // guarded by this

    @Override
    public synchronized RootKey load() {
        if (key == null) {
            SecureRandom random = new SecureRandom();
            key = RootKey.fill(k -> {
                byte[] bytes = new byte[RootKey.KEY_BYTES];
                try {
                    random.nextBytes(bytes);
                    MemorySegment.copy(MemorySegment.ofArray(bytes), 0, k, 0, RootKey.KEY_BYTES);
                } finally {
                    java.util.Arrays.fill(bytes, (byte) 0);
                }
            });
            LOG.log(System.Logger.Level.WARNING, "using an ephemeral random root key (" + key.keyId() + ") for development:"
                    + " nothing sealed under it survives this process; configure a key file or an inherited file descriptor"
                    + " for production");
        }
        MemorySegment source = key.segment();
        return RootKey.fill(k -> MemorySegment.copy(source, 0, k, 0, RootKey.KEY_BYTES));
    }

    @Override
    public String describe() {
        return "ephemeral random key (development only)";
    }

    @Override
    public synchronized void close() {
        if (key != null) {
            key.close();
        }
    }
}
