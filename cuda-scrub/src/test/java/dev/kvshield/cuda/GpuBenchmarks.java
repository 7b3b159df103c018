package dev.kvshield.cuda;

import static dev.kvshield.cuda.CudaDevice.check;
import static jcuda.driver.JCudaDriver.cuLaunchKernel;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoDAsync;
import static jcuda.driver.JCudaDriver.cuMemsetD8Async;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamSynchronize;

import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.geometry.PoolGeometry;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUstream;
import jcuda.driver.CUstream_flags;

/**
 * The GPU benchmarks of the GPU check, all in one run and all counted as page bytes processed per
 * second, each against a plain driver baseline over the same byte count measured in the same run:
 * fused scrub vs one {@code cuMemsetD8} over a contiguous region; fused scrub of 4096 scattered
 * pages vs one {@code cuMemsetD8Async} per page region; chacha20-xor vs a device-to-device copy;
 * verify-zero vs a plain read kernel; and kernel launches per release batch.
 *
 * <p>Every timing is host wall-clock of a complete synchronous operation (enqueue, then wait for
 * completion) — what the pool pays per batch — median of the measured iterations after warm-up.
 */
final class GpuBenchmarks {
    /** One comparison: the kvshield operation and its baseline over the same bytes. */
    record Result(String name, long bytes, double bytesPerSecond, String baseline, double baselineBytesPerSecond,
            double goalRatio) {
        double ratio() {
            return bytesPerSecond / baselineBytesPerSecond;
        }

        boolean goalMet() {
            return goalRatio <= 0 || ratio() >= goalRatio;
        }
    }

    private static final int WARMUP = 3;
    private static final int ITERATIONS = 15;
    private static final long MIB = 1L << 20;

    /** Llama-3-8B-like KV cache: 32 layers, K and V of 8 heads x 128 x bf16 (2 KiB per token per buffer). */
    static PoolGeometry modelGeometry(int pageSizeTokens, int pageCount) {
        return PoolGeometry.builder().mha(32, 8, 128, 2).pageSizeTokens(pageSizeTokens).pageCount(pageCount).build();
    }

    private final CudaDevice device;
    private final CUstream stream = new CUstream();
    final List<Result> results = new ArrayList<>();
    long launchesPerBatch = -1;

    GpuBenchmarks(CudaDevice device) {
        this.device = device;
    }

    void run() {
        device.makeCurrent();
        check(cuStreamCreate(stream, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        try {
            contiguousBatches();
            scatteredPages();
        } finally {
            device.makeCurrent();
            cuStreamDestroy(stream);
        }
    }

    /** 16-token pages of 2 MiB across all buffers: batches of 64 MiB, 256 MiB and 1 GiB. */
    private void contiguousBatches() {
        PoolGeometry g = modelGeometry(16, 513);
        long pageBytes = g.pageBytesAllBuffers();
        try (CudaPageMemory m = CudaPageMemory.allocate(device, g)) {
            long maxBytes = 512 * pageBytes;
            CUdeviceptr a = alloc(maxBytes);
            CUdeviceptr b = alloc(maxBytes);
            CUdeviceptr fold = alloc(4L * device.maxBlocks() * KernelAbi.THREADS_PER_BLOCK);
            try {
                for (long batchBytes : new long[] {64 * MIB, 256 * MIB, 1024 * MIB}) {
                    int count = (int) (batchBytes / pageBytes);
                    int[] pages = new int[count];
                    Arrays.setAll(pages, i -> 1 + i);
                    int[] dirty = new int[count];
                    int[] generations = new int[count];
                    byte[] slots = new byte[count];
                    long bytes = count * pageBytes;
                    String size = bytes / MIB + " MiB";
                    long before = m.launchCount();
                    m.scrub(pages, 0, count);
                    launchesPerBatch = Math.max(launchesPerBatch, m.launchCount() - before);
                    double scrub = rate(bytes, () -> m.scrub(pages, 0, count));
                    double memset = rate(bytes, () -> {
                        check(cuMemsetD8Async(a, (byte) 0, bytes, stream), "cuMemsetD8Async");
                        sync();
                    });
                    results.add(new Result("fused scrub, " + size, bytes, scrub, "cuMemsetD8 contiguous", memset,
                            bytes >= 64 * MIB ? 0.85 : 0));
                    double seal = rate(bytes, () -> m.chacha20Xor(pages, generations, slots, 0, count, 1, s -> {}));
                    double copy = rate(bytes, () -> {
                        check(cuMemcpyDtoDAsync(b, a, bytes, stream), "cuMemcpyDtoDAsync");
                        sync();
                    });
                    results.add(new Result("chacha20-xor, " + size, bytes, seal, "device-to-device copy", copy, 0.5));
                    m.scrub(pages, 0, count);
                    double verify = rate(bytes, () -> m.verifyZero(pages, 0, count, dirty));
                    double read = rate(bytes, () -> readFold(a, bytes, fold));
                    results.add(new Result("verify-zero, " + size, bytes, verify, "plain read", read, 0));
                }
            } finally {
                device.makeCurrent();
                cuMemFree(a);
                cuMemFree(b);
                cuMemFree(fold);
            }
        }
    }

    /** 4096 scattered one-token pages (SGLang's default page size) across 64 buffers. */
    private void scatteredPages() {
        PoolGeometry g = modelGeometry(1, 65537);
        try (CudaPageMemory m = CudaPageMemory.allocate(device, g)) {
            int[] all = new int[g.usablePages()];
            Arrays.setAll(all, i -> 1 + i);
            SplittableRandom r = new SplittableRandom(20260101L);
            for (int i = all.length - 1; i > 0; i--) {
                int j = r.nextInt(i + 1);
                int t = all[i];
                all[i] = all[j];
                all[j] = t;
            }
            int[] pages = Arrays.copyOf(all, 4096);
            long bytes = pages.length * g.pageBytesAllBuffers();
            CUdeviceptr[] regions = new CUdeviceptr[pages.length * g.bufferCount()];
            for (int i = 0; i < pages.length; i++) {
                for (int buf = 0; buf < g.bufferCount(); buf++) {
                    regions[i * g.bufferCount() + buf] = new CUdeviceptr()
                            .withByteOffset(m.bufferAddress(buf) + pages[i] * g.pageBytes(buf));
                }
            }
            long regionBytes = g.pageBytes(0);
            double fused = rate(bytes, () -> m.scrub(pages, 0, pages.length));
            double loop = rate(bytes, () -> {
                for (CUdeviceptr region : regions) {
                    check(cuMemsetD8Async(region, (byte) 0, regionBytes, stream), "cuMemsetD8Async");
                }
                sync();
            });
            results.add(new Result("fused scrub, 4096 scattered pages x " + g.bufferCount() + " buffers", bytes, fused,
                    "one cuMemsetD8Async per page region (" + regions.length + " calls)", loop, 10.0));
        }
    }

    private void readFold(CUdeviceptr src, long bytes, CUdeviceptr out) {
        int blocks = device.maxBlocks();
        Pointer params = Pointer.to(Pointer.to(src), Pointer.to(new long[] {bytes / 16}), Pointer.to(out));
        check(cuLaunchKernel(device.readFoldFunction(), blocks, 1, 1, KernelAbi.THREADS_PER_BLOCK, 1, 1, 0, stream, params,
                null), "cuLaunchKernel(read fold)");
        sync();
    }

    private double rate(long bytes, Runnable op) {
        for (int i = 0; i < WARMUP; i++) {
            op.run();
        }
        long[] nanos = new long[ITERATIONS];
        for (int i = 0; i < ITERATIONS; i++) {
            device.makeCurrent();
            long start = System.nanoTime();
            op.run();
            nanos[i] = System.nanoTime() - start;
        }
        Arrays.sort(nanos);
        return bytes / (nanos[ITERATIONS / 2] / 1e9);
    }

    private void sync() {
        check(cuStreamSynchronize(stream), "cuStreamSynchronize");
    }

    private CUdeviceptr alloc(long bytes) {
        CUdeviceptr p = new CUdeviceptr();
        check(cuMemAlloc(p, bytes), "cuMemAlloc(" + bytes + ")");
        return p;
    }
}
