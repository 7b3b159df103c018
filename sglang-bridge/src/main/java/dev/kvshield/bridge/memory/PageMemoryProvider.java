package dev.kvshield.bridge.memory;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealerFactory;

/**
 * Builds a {@link PageMemory} over buffers the engine owns. Implementations are found by
 * {@link #name()} through {@link java.util.ServiceLoader} (a {@code META-INF/services} entry), so a
 * backend plugs in by being on the class path.
 */
public interface PageMemoryProvider {
    /** The backend name operators configure, e.g. {@code "cpu-external"} or {@code "cuda"}. */
    String name();

    /**
     * Wraps the engine's buffers.
     *
     * @param geometry the pool's geometry; buffer {@code b} is {@code buffers.addresses()[b]} of
     *     {@code buffers.byteSizes()[b]} bytes
     * @throws IllegalArgumentException for buffers this backend cannot wrap (the message names them)
     */
    PageMemory open(PoolGeometry geometry, EngineBuffers buffers);

    /** The ENCRYPT sealer for memory this provider opens, keyed from {@code source}. */
    PageSealerFactory sealerFactory(RootKeySource source);
}
