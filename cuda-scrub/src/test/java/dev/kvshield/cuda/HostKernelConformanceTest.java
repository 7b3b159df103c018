package dev.kvshield.cuda;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.PageMemoryConformanceTest;

/** The backend conformance suite over the kernels' host build (launch arguments as on the GPU). */
class HostKernelConformanceTest extends PageMemoryConformanceTest {
    @Override
    protected PageMemory create(PoolGeometry geometry) {
        return HostKernelPageMemory.allocate(geometry, HostKernels.require(), 7, 32);
    }
}
