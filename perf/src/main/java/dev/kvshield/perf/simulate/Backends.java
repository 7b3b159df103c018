package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.util.Locale;

/**
 * The memory backends the lab can run on: {@code cpu} (off-heap host memory, always there) and
 * {@code cuda} (the cuda-scrub module on a GPU), looked up by name so the lab builds without it.
 */
public final class Backends {
    static final String CUDA_PROBE_CLASS = "dev.kvshield.cuda.CudaProbe";
    static final String CUDA_DEVICE_CLASS = "dev.kvshield.cuda.CudaDevice";
    static final String CUDA_MEMORY_CLASS = "dev.kvshield.cuda.CudaPageMemory";

    private Backends() {}

    /** Checks a backend name: {@code cpu} or {@code cuda}. */
    public static String checkName(String name) {
        String n = name == null ? "" : name.trim().toLowerCase(Locale.ROOT);
        if (!n.equals("cpu") && !n.equals("cuda")) {
            throw new IllegalArgumentException("unknown backend '" + name + "'; allowed: cpu, cuda");
        }
        return n;
    }

    /** Allocates page memory for {@code geometry} on the named backend, or says why it cannot. */
    public static Availability<PageMemory> allocate(String backend, PoolGeometry geometry) {
        if (checkName(backend).equals("cpu")) {
            return Availability.of(OffHeapPageMemory.allocate(geometry));
        }
        try {
            Object probe = Class.forName(CUDA_PROBE_CLASS).getMethod("probe").invoke(null);
            boolean ok = (boolean) probe.getClass().getMethod("available").invoke(probe);
            if (!ok) {
                return Availability.unavailable("no usable GPU: " + probe.getClass().getMethod("reason").invoke(probe));
            }
            Class<?> deviceType = Class.forName(CUDA_DEVICE_CLASS);
            Object device = deviceType.getMethod("open", int.class).invoke(null, 0);
            Object memory = Class.forName(CUDA_MEMORY_CLASS).getMethod("allocate", deviceType, PoolGeometry.class)
                    .invoke(null, device, geometry);
            return Availability.of((PageMemory) memory);
        } catch (ClassNotFoundException e) {
            return Availability.unavailable("the cuda-scrub module is not on the class path (" + e.getMessage() + " not found)");
        } catch (ReflectiveOperationException | ClassCastException | LinkageError e) {
            return Availability.unavailable("the cuda backend could not start: " + e);
        }
    }
}
