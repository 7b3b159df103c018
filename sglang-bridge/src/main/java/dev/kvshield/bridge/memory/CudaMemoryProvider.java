package dev.kvshield.bridge.memory;

import dev.kvshield.cuda.CudaDevice;
import dev.kvshield.cuda.CudaPageMemory;
import dev.kvshield.cuda.CudaProbe;
import dev.kvshield.cuda.seal.CudaPageSealerFactory;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealerFactory;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * {@code cuda}: the engine's CUDA tensors, wrapped by device pointer through cuda-scrub's
 * {@link CudaPageMemory#wrap}, ordered after the engine's stream and its forward-launch events;
 * ENCRYPT seals with {@link CudaPageSealerFactory}. Registered through {@code META-INF/services}.
 *
 * <p>Implementation notes: every argument is checked before the GPU is probed, so a bad hand-over
 * fails the same way on a machine without a GPU; the probe runs before any JCuda class loads
 * ({@link CudaProbe}), so a CPU-only JVM never touches CUDA natives. One {@link CudaDevice} per
 * ordinal is opened on first use and kept for the life of the process, like the engine's own
 * primary context (closing it would unload the kernels under another pool of the same process).
 */
public final class CudaMemoryProvider implements PageMemoryProvider {
    public static final String NAME = "cuda";
    private static final Map<Integer, CudaDevice> DEVICES = new ConcurrentHashMap<>();

    @Override
    public String name() {
        return NAME;
    }

    /**
     * @throws IllegalArgumentException for host buffers, a null address, or a zero event handle
     *     (an event the engine never recorded), naming the value; or when no GPU is usable, naming
     *     the probe's reason
     */
    @Override
    public PageMemory open(PoolGeometry geometry, EngineBuffers buffers) {
        check(buffers);
        CudaProbe.Result probe = CudaProbe.probe();
        if (!probe.available()) {
            throw new IllegalArgumentException(NAME + " backend for device " + buffers.deviceIndex() + ": no usable GPU ("
                    + probe.reason() + ")");
        }
        CudaDevice device = DEVICES.computeIfAbsent(buffers.deviceIndex(), CudaDevice::open);
        return CudaPageMemory.wrap(device, geometry, buffers.addresses(), buffers.byteSizes(), buffers.streamHandle(),
                buffers.eventHandles());
    }

    /** The checks {@link #open} makes before it touches the GPU. */
    static void check(EngineBuffers buffers) {
        if (buffers.deviceIndex() < 0) {
            throw new IllegalArgumentException(NAME + " wraps CUDA device memory, but host buffers (device "
                    + buffers.deviceIndex() + ") were given: use \"" + ExternalMemoryProvider.NAME + "\"");
        }
        long[] a = buffers.addresses();
        for (int b = 0; b < a.length; b++) {
            if (a[b] == 0) {
                throw new IllegalArgumentException(NAME + ": buffer " + b + " has a null device address");
            }
        }
        long[] e = buffers.eventHandles();
        for (int i = 0; i < e.length; i++) {
            if (e[i] == 0) {
                throw new IllegalArgumentException(NAME + ": engine event " + i + " has handle 0 (record it once before"
                        + " handing it over: torch creates the CUDA event lazily at its first record)");
            }
        }
    }

    @Override
    public PageSealerFactory sealerFactory(RootKeySource source) {
        return new CudaPageSealerFactory(source);
    }
}
