package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;


import dev.kvshield.cuda.seal.CudaPageSealerFactory;
import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.PageMemoryConformanceTest;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.TenantRegistry;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * The GPU sealer ({@link dev.kvshield.cuda.seal.CudaPageSealer}) over the kernels' host build against tenant-keys' CPU
 * sealer sharing one keyring: the same bytes after every seal, unseal, rotation and shred, and the
 * same refusals. A planted skipped buffer must break the agreement.
 */
class HostKernelSealerTest {
    static List<PoolGeometry> geometries() {
        List<PoolGeometry> all = new ArrayList<>(PageMemoryConformanceTest.geometries());
        all.add(PoolGeometry.builder().mla(2, 576, 2).pageSizeTokens(3).pageCount(5).build());
        all.add(PoolGeometry.builder().layers(3).buffers(List.of(BufferKind.K, BufferKind.V), 6, 10).pageSizeTokens(7)
                .pageCount(4).build());
        return all;
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void gpuSealerAgreesWithTheCpuSealerByteForByte(PoolGeometry g) {
        assertNull(SealerAgreement.sealBothWays(g, x -> HostKernelPageMemory.allocate(x, HostKernels.require(), 5, 32),
                0xC0FFEEL + g.hashCode()));
    }

    @Test
    void plantedSkippedBufferDisagreesWithTheCpuSealer() {
        for (PoolGeometry g : geometries()) {
            KernelLauncher planted = PlantedBugs.skippedBuffer(HostKernels.require());
            assertNotNull(SealerAgreement.sealBothWays(g, x -> HostKernelPageMemory.allocate(x, planted, 5, 32), 0xC0FFEEL + g.hashCode()),
                    g.toString());
        }
    }

    @Test
    void factoryRefusesMemoryThatCannotRunTheKernelNamingIt() {
        PoolGeometry g = PageMemoryConformanceTest.geometries().getFirst();
        try (PageMemory host = OffHeapPageMemory.allocate(g)) {
            CudaPageSealerFactory factory = new CudaPageSealerFactory(RootKeySource.ephemeral());
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> factory.create(
                    new PageSealerFactory.Context("p", 0, g, host, new TenantRegistry((name, policy) -> { }))));
            assertTrue(e.getMessage().contains(host.describe()), e.getMessage());
        }
    }
}
