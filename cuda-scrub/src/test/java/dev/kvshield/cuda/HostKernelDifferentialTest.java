package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import java.util.function.Function;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The kernels' host build against the CPU references, byte for byte, over many random geometries,
 * page lists and grid shapes; each oracle has planted-bug twins that must make it fail.
 */
class HostKernelDifferentialTest {
    private static final long SEED = 0x5EEDC0DAL;
    private static final int CASES = 40;

    private static Function<PoolGeometry, PageMemory> backend(KernelLauncher launcher, int maxBlocks, int threads) {
        return g -> HostKernelPageMemory.allocate(g, launcher, maxBlocks, threads);
    }

    /** Grid shapes from one thread (everything in one loop) to more threads than units. */
    @ParameterizedTest
    @CsvSource({"1, 1", "3, 7", "5, 32", "64, 256", "4096, 256"})
    void scrubAndVerifyMatchTheCpuBackendAtEveryGridShape(int maxBlocks, int threads) {
        assertNull(KernelDifferential.scrubAndVerify(SEED + maxBlocks, CASES, backend(HostKernels.require(), maxBlocks, threads)));
    }

    @ParameterizedTest
    @CsvSource({"1, 1", "3, 7", "64, 256"})
    void chachaMatchesBouncyCastleAndUndoesItselfAtEveryGridShape(int maxBlocks, int threads) {
        assertNull(KernelDifferential.chacha(SEED + maxBlocks, CASES / 2, backend(HostKernels.require(), maxBlocks, threads)));
    }

    @Test
    void plantedOffByOnePageStrideIsCaughtByEveryOracle() {
        KernelLauncher planted = PlantedBugs.offByOnePageStride(HostKernels.require());
        assertNotNull(KernelDifferential.scrubAndVerify(SEED, CASES, backend(planted, 5, 32)));
        assertNotNull(KernelDifferential.chacha(SEED, CASES / 2, backend(planted, 5, 32)));
    }

    @Test
    void plantedSkippedBufferIsCaughtByEveryOracle() {
        KernelLauncher planted = PlantedBugs.skippedBuffer(HostKernels.require());
        assertNotNull(KernelDifferential.scrubAndVerify(SEED, CASES, backend(planted, 5, 32)));
        assertNotNull(KernelDifferential.chacha(SEED, CASES / 2, backend(planted, 5, 32)));
    }

    @Test
    void theVerifyOracleAloneCatchesBothPlantedBugs() {
        HostKernels exact = HostKernels.require();
        for (KernelLauncher planted : new KernelLauncher[] {PlantedBugs.offByOnePageStride(exact), PlantedBugs.skippedBuffer(exact)}) {
            String diff = KernelDifferential.scrubAndVerify(SEED, CASES, backend(PlantedBugs.onlyVerifyFrom(exact, planted), 5, 32));
            assertNotNull(diff);
            assertTrue(diff.contains("verifyZero"), diff);
        }
    }
}
