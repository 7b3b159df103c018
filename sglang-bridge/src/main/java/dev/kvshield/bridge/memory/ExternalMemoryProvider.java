package dev.kvshield.bridge.memory;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.external.ExternalPageMemory;
import dev.kvshield.protection.PageSealerFactory;

/** {@code cpu-external}: CPU tensors the engine owns, wrapped by their data pointers. */
public final class ExternalMemoryProvider implements PageMemoryProvider {
    public static final String NAME = "cpu-external";

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public PageMemory open(PoolGeometry geometry, EngineBuffers buffers) {
        if (buffers.deviceIndex() >= 0) {
            throw new IllegalArgumentException(NAME + " wraps host memory only, but device " + buffers.deviceIndex()
                    + " was given: CUDA buffers need the \"cuda\" backend (cuda-scrub)");
        }
        return ExternalPageMemory.wrap(geometry, buffers.addresses(), buffers.byteSizes());
    }

    @Override
    public PageSealerFactory sealerFactory(RootKeySource source) {
        return new HostPageSealerFactory(source);
    }
}
