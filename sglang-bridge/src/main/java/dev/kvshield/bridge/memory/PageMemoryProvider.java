package dev.kvshield.bridge.memory;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;

/**
 * Builds a {@link PageMemory} over buffers the engine owns. Implementations are found by
 * {@link #name()} through {@link java.util.ServiceLoader} (a {@code META-INF/services} entry), so a
 * backend module (e.g. cuda-scrub, name {@code "cuda"}) plugs in by being on the class path.
 */
public interface PageMemoryProvider {
    /** The backend name operators configure, e.g. {@code "cpu-external"} or {@code "cuda"}. */
    String name();

    /**
     * Wraps the engine's buffers.
     *
     * @param geometry the pool's geometry; buffer {@code b} is {@code addresses[b]} of {@code byteSizes[b]} bytes
     * @param deviceIndex the engine's device ordinal (-1 for host memory)
     */
    PageMemory open(PoolGeometry geometry, long[] addresses, long[] byteSizes, int deviceIndex);
}
