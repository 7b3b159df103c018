package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertNull;

import dev.kvshield.geometry.PoolGeometry;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** The GPU sealer on the GPU agrees byte for byte with tenant-keys' CPU sealer. */
@RequiresGpu
class CudaSealerTest {
    private static CudaDevice device;

    @BeforeAll
    static void requireGpu() {
        device = GpuTests.requireDevice();
    }

    static java.util.List<PoolGeometry> geometries() {
        return HostKernelSealerTest.geometries();
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void gpuSealerAgreesWithTheCpuSealerByteForByte(PoolGeometry g) {
        assertNull(SealerAgreement.sealBothWays(g, x -> CudaPageMemory.allocate(device, x), 0xC0FFEEL + g.hashCode()));
    }
}
