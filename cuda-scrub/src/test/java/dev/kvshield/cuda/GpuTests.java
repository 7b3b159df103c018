package dev.kvshield.cuda;

import dev.kvshield.testing.Requirements;

/**
 * The device the GPU tests share: opened once per JVM, after {@link RequiresGpu} let the class
 * run. The assumption below only matters when a GPU test runs without that condition (e.g. picked
 * from an IDE with the condition deactivated).
 */
final class GpuTests {
    private static CudaDevice device; // guarded by GpuTests.class

    private GpuTests() {}

    /** Skips the calling test class unless a GPU is usable; returns the shared device. */
    static synchronized CudaDevice requireDevice() {
        CudaProbe.Result probe = CudaProbe.probe();
        Requirements.assumeGpu(probe.available(), probe.reason());
        if (device == null) {
            device = CudaDevice.open(0);
        }
        return device;
    }
}
