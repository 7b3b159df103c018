package dev.kvshield.perf.simulate;

import dev.kvshield.KvShieldException;
import dev.kvshield.cuda.CudaDevice;
import dev.kvshield.cuda.CudaPageMemory;
import dev.kvshield.cuda.CudaProbe;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.util.Locale;

/**
 * The memory backends the lab can run on: {@code cpu} (off-heap host memory, always there) and
 * {@code cuda} (cuda-scrub's device memory, when a GPU answers the probe; the probe touches no
 * CUDA class before it found {@code libcuda.so.1}).
 */
public final class Backends {
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
        CudaProbe.Result probe = CudaProbe.probe();
        if (!probe.available()) {
            return Availability.unavailable("no usable GPU: " + probe.reason());
        }
        try {
            return Availability.of(CudaPageMemory.allocate(CudaDevice.open(0), geometry));
        } catch (KvShieldException | LinkageError e) {
            return Availability.unavailable("the cuda backend could not start: " + e.getMessage());
        }
    }
}
