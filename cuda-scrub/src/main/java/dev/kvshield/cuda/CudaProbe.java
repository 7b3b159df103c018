package dev.kvshield.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.SymbolLookup;

/**
 * Cheap, clean detection of a usable NVIDIA GPU: probes for the driver library
 * {@code libcuda.so.1} with FFM first and only then lets JCuda load its natives and call
 * {@code cuInit}, so a machine without a driver never loads JCuda's natives. The result is computed
 * once per JVM, on first call (never from a static initializer). Thread-safe.
 */
public final class CudaProbe {
    /** What the probe found: {@code available}, or why not. */
    public record Result(boolean available, String reason) {}

    private static final Object LOCK = new Object();
    private static Result result; // guarded by LOCK

    private CudaProbe() {}

    /** Probes once and returns the cached result afterwards. */
    public static Result probe() {
        synchronized (LOCK) {
            if (result == null) {
                result = run();
            }
            return result;
        }
    }

    private static Result run() {
        try (Arena arena = Arena.ofConfined()) {
            SymbolLookup.libraryLookup("libcuda.so.1", arena);
        } catch (IllegalArgumentException e) {
            return new Result(false, "libcuda.so.1 (the NVIDIA driver library) is not installed or not on the loader path");
        }
        // Only past this point may a JCuda class be touched.
        return CudaDevice.initAndCount();
    }
}
