package dev.kvshield.cuda;

import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventRecord;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemsetD8Async;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamSynchronize;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.testing.Patterns;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUevent_flags;
import jcuda.driver.CUstream;
import jcuda.driver.CUstream_flags;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The kernels on the GPU against the CPU references byte for byte (same seeds and cases as the
 * host-build tests), one launch per batch, and the engine-owned mode ordered after the engine's
 * streams.
 */
@RequiresGpu
class CudaKernelsTest {
    private static final long SEED = 0x5EEDC0DAL;
    private static CudaDevice device;

    @BeforeAll
    static void requireGpu() {
        device = GpuTests.requireDevice();
    }

    @Test
    void scrubAndVerifyMatchTheCpuBackend() {
        assertNull(KernelDifferential.scrubAndVerify(SEED, 40, g -> CudaPageMemory.allocate(device, g)));
    }

    @Test
    void chachaMatchesBouncyCastleAndUndoesItself() {
        assertNull(KernelDifferential.chacha(SEED, 20, g -> CudaPageMemory.allocate(device, g)));
    }

    @Test
    void everyBatchIsOneLaunchWhateverItsSize() {
        PoolGeometry g = PoolGeometry.builder().mha(8, 2, 64, 2).pageSizeTokens(16).pageCount(600).build();
        try (CudaPageMemory m = CudaPageMemory.allocate(device, g)) {
            int[] pages = new int[512];
            java.util.Arrays.setAll(pages, i -> 1 + i);
            long before = m.launchCount();
            m.scrub(pages, 0, pages.length);
            assertEquals(before + 1, m.launchCount());
            m.verifyZero(pages, 0, pages.length, new int[pages.length]);
            assertEquals(before + 2, m.launchCount());
            m.chacha20Xor(pages, new int[pages.length], new byte[pages.length], 0, pages.length, 1, s -> {});
            assertEquals(before + 3, m.launchCount());
        }
    }

    @Test
    void keysAreWipedOnceTheLaunchReturns() {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 8, 2).pageSizeTokens(4).pageCount(4).build();
        try (CudaPageMemory m = CudaPageMemory.allocate(device, g)) {
            dev.kvshield.cuda.kernel.KeySlots[] seen = new dev.kvshield.cuda.kernel.KeySlots[1];
            m.chacha20Xor(new int[] {1, 2}, new int[] {1, 1}, new byte[2], 0, 2, 1, s -> {
                s.slot(0).fill((byte) 0x3C);
                seen[0] = s;
            });
            assertTrue(Patterns.allZero(seen[0].block()), "key bytes left in the launch block");
        }
    }

    /**
     * Engine-owned memory: the engine queues a fill of a page on its own stream and, on a second
     * stream, records an event after another fill; a scrub issued right after (without host
     * synchronisation) must run after both, so the pages read back zero.
     */
    @Test
    void engineOwnedMemoryIsScrubbedOnlyAfterTheEnginesQueuedWork() {
        PoolGeometry g = PoolGeometry.builder().mha(2, 4, 128, 2).pageSizeTokens(64).pageCount(64).build();
        device.makeCurrent();
        List<CUdeviceptr> buffers = new ArrayList<>();
        CUstream main = new CUstream();
        CUstream side = new CUstream();
        CUevent sideDone = new CUevent();
        CudaDevice.check(cuStreamCreate(main, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        CudaDevice.check(cuStreamCreate(side, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        CudaDevice.check(cuEventCreate(sideDone, CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        long[] addresses = new long[g.bufferCount()];
        long[] sizes = new long[g.bufferCount()];
        try {
            for (int b = 0; b < g.bufferCount(); b++) {
                CUdeviceptr p = new CUdeviceptr();
                CudaDevice.check(cuMemAlloc(p, g.bufferBytes(b)), "cuMemAlloc");
                buffers.add(p);
                addresses[b] = RawHandles.address(p);
                sizes[b] = g.bufferBytes(b);
            }
            try (CudaPageMemory m = CudaPageMemory.wrap(device, g, addresses, sizes, RawHandles.address(main),
                    new long[] {RawHandles.address(sideDone)}); Arena arena = Arena.ofConfined()) {
                for (int round = 0; round < 20; round++) {
                    device.makeCurrent();
                    for (int b = 0; b < g.bufferCount(); b++) {
                        // Whole-buffer fills take long enough to still be queued when the scrub is issued.
                        CUstream s = b % 2 == 0 ? main : side;
                        CudaDevice.check(cuMemsetD8Async(buffers.get(b), (byte) 0x5A, g.bufferBytes(b), s), "cuMemsetD8Async");
                    }
                    CudaDevice.check(cuEventRecord(sideDone, side), "cuEventRecord");
                    int[] pages = {1, 7, 63};
                    m.scrub(pages, 0, pages.length);
                    int[] dirty = new int[pages.length];
                    assertEquals(0, m.verifyZero(pages, 0, pages.length, dirty), "a scrubbed page was overwritten by queued engine work");
                    for (int p : pages) {
                        for (int b = 0; b < g.bufferCount(); b++) {
                            MemorySegment dst = arena.allocate(g.pageBytes(b));
                            m.read(p, b, 0, dst);
                            assertTrue(Patterns.allZero(dst), "page " + p + " buffer " + b);
                        }
                    }
                    device.makeCurrent();
                    CudaDevice.check(cuStreamSynchronize(main), "cuStreamSynchronize");
                    CudaDevice.check(cuStreamSynchronize(side), "cuStreamSynchronize");
                }
            }
        } finally {
            device.makeCurrent();
            buffers.forEach(p -> cuMemFree(p));
            cuEventDestroy(sideDone);
            cuStreamDestroy(main);
            cuStreamDestroy(side);
        }
    }

    @Test
    void wrappingMemoryThatIsNotWhollyInsideOneAllocationFails() {
        // 2 MiB exactly, a whole allocation granule, so the driver's rounding cannot hide an overrun.
        PoolGeometry g = PoolGeometry.builder().mla(1, 1024, 1).pageSizeTokens(1024).pageCount(2).build();
        device.makeCurrent();
        CUdeviceptr p = new CUdeviceptr();
        CudaDevice.check(cuMemAlloc(p, g.bufferBytes(0)), "cuMemAlloc");
        try {
            long address = RawHandles.address(p);
            InvalidGeometryException e = assertThrows(InvalidGeometryException.class, () -> CudaPageMemory.wrap(device, g,
                    new long[] {address + 16}, new long[] {g.bufferBytes(0)}, 0, new long[0]));
            assertTrue(e.getMessage().contains("allocation ends"), e.getMessage());
            assertThrows(InvalidGeometryException.class, () -> CudaPageMemory.wrap(device, g, new long[] {address + 8},
                    new long[] {g.bufferBytes(0) - 8}, 0, new long[0]));
        } finally {
            device.makeCurrent();
            cuMemFree(p);
        }
    }
}
