package dev.kvshield.memory;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;

class OffHeapConformanceTest extends PageMemoryConformanceTest {
    @Override
    protected PageMemory create(PoolGeometry geometry) {
        return OffHeapPageMemory.allocate(geometry);
    }
}
