package dev.kvshield.bridge.memory;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.PageSealerFactory;

/**
 * {@code cpu-offheap}: the pool's own off-heap memory, ignoring the engine's buffers. For
 * simulations and benchmarks of the bookkeeping alone; the engine's KV bytes are then not protected.
 */
public final class OffHeapMemoryProvider implements PageMemoryProvider {
    public static final String NAME = "cpu-offheap";

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public PageMemory open(PoolGeometry geometry, EngineBuffers buffers) {
        return OffHeapPageMemory.allocate(geometry);
    }

    @Override
    public PageSealerFactory sealerFactory(RootKeySource source) {
        return new HostPageSealerFactory(source);
    }
}
