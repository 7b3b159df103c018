package dev.kvshield.cuda;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.PageMemoryConformanceTest;
import org.junit.jupiter.api.BeforeAll;

/** The backend conformance suite on the GPU, over device memory the backend allocates. */
@RequiresGpu
class CudaConformanceTest extends PageMemoryConformanceTest {
    private static CudaDevice device;

    @BeforeAll
    static void requireGpu() {
        device = GpuTests.requireDevice();
    }

    @Override
    protected PageMemory create(PoolGeometry geometry) {
        return CudaPageMemory.allocate(device, geometry);
    }
}
