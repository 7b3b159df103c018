package dev.kvshield.cuda;

import static dev.kvshield.cuda.CudaDevice.check;
import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventElapsedTime;
import static jcuda.driver.JCudaDriver.cuEventRecord;
import static jcuda.driver.JCudaDriver.cuEventSynchronize;
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
import jcuda.driver.CUevent;
import jcuda.driver.CUstream;
import jcuda.driver.CUstream_flags;

/**
 * The GPU benchmarks of the GPU check, all in one run, all counted as page bytes processed per
 * second, each against a plain driver baseline over the same byte count measured in the same run:
 * fused scrub vs one {@code cuMemsetD8} over a contiguous region; fused scrub of 4096 scattered
 * pages vs one {@code cuMemsetD8Async} per page region; chacha20-xor vs a device-to-device copy;
 * verify-zero vs a plain read kernel; and kernel launches per release batch.
 *
 * <p>Each operation is measured twice: host wall time of a complete synchronous call (enqueue,
 * wait, confirm: what the pool pays per batch; median of the iterations after warm-up) and device
 * time between CUDA events around the same operation enqueued back to back on one stream (what
 * the GPU spends). Bandwidth goals are judged on device time; the scattered-pages goal, which is
 * about the per-call cost of many small memsets, on wall time.
 */
final class GpuBenchmarks {
    /**
     * One comparison: the kvshield operation and its baseline over the same bytes;
     * {@code goalOnDevice} says which ratio the goal applies to (a goal of 0: none).
     */
    record Result(String name, long bytes, Rate rate, String baseline, Rate baselineRate, double goalRatio,
            boolean goalOnDevice) {
        double wallRatio() {
            return rate.wallBytesPerSecond() / baselineRate.wallBytesPerSecond();
        }

        double deviceRatio() {
            return rate.deviceBytesPerSecond() / baselineRate.deviceBytesPerSecond();
        }

        boolean goalMet() {
            return goalRatio <= 0 || (goalOnDevice ? deviceRatio() : wallRatio()) >= goalRatio;
        }
    }

    /** Throughput of one operation: wall clock (what the caller waits) and device (what the GPU spends). */
    record Rate(double wallBytesPerSecond, double deviceBytesPerSecond) {}

    /** An operation as the benchmarks drive it: enqueue only, or the complete synchronous call. */
    private interface Op {
        void enqueue();

        void call();
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
    private final CUevent start = new CUevent();
    private final CUevent end = new CUevent();
    final List<Result> results = new ArrayList<>();
    long launchesPerBatch = -1;

    GpuBenchmarks(CudaDevice device) {
        this.device = device;
    }

    void run() {
        device.makeCurrent();
        check(cuStreamCreate(stream, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        check(cuEventCreate(start, 0), "cuEventCreate");
        check(cuEventCreate(end, 0), "cuEventCreate");
        try {
            contiguousBatches();
            scatteredPages();
        } finally {
            device.makeCurrent();
            cuEventDestroy(start);
            cuEventDestroy(end);
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
                    // Back-to-back enqueues restage the same list into the same pinned staging: the bytes
                    // an in-flight copy reads do not change, so the overlap is harmless here.
                    Rate scrub = measure(bytes, m.stream(), op(() -> m.enqueueScrub(pages, 0, count), () -> m.scrub(pages, 0, count)));
                    Rate memset = measure(bytes, stream, op(() -> check(cuMemsetD8Async(a, (byte) 0, bytes, stream), "cuMemsetD8Async"),
                            null));
                    results.add(new Result("fused scrub, " + size, bytes, scrub, "cuMemsetD8 contiguous", memset,
                            bytes >= 64 * MIB ? 0.85 : 0, true));
                    Rate seal = measure(bytes, m.stream(), op(
                            () -> m.enqueueChacha20Xor(pages, generations, slots, 0, count, 1, s -> { }),
                            () -> m.chacha20Xor(pages, generations, slots, 0, count, 1, s -> { })));
                    Rate copy = measure(bytes, stream, op(() -> check(cuMemcpyDtoDAsync(b, a, bytes, stream), "cuMemcpyDtoDAsync"),
                            null));
                    results.add(new Result("chacha20-xor, " + size, bytes, seal, "device-to-device copy", copy, 0.5, true));
                    m.scrub(pages, 0, count);
                    Rate verify = measure(bytes, m.stream(), op(() -> m.enqueueVerifyZero(pages, 0, count),
                            () -> m.verifyZero(pages, 0, count, dirty)));
                    Rate read = measure(bytes, stream, op(() -> readFold(a, bytes, fold), null));
                    results.add(new Result("verify-zero, " + size, bytes, verify, "plain read", read, 0, true));
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
            Rate fused = measure(bytes, m.stream(), op(() -> m.enqueueScrub(pages, 0, pages.length),
                    () -> m.scrub(pages, 0, pages.length)));
            Rate loop = measure(bytes, stream, op(() -> {
                for (CUdeviceptr region : regions) {
                    check(cuMemsetD8Async(region, (byte) 0, regionBytes, stream), "cuMemsetD8Async");
                }
            }, null));
            results.add(new Result("fused scrub, 4096 scattered pages x " + g.bufferCount() + " buffers", bytes, fused,
                    "one cuMemsetD8Async per page region (" + regions.length + " calls)", loop, 10.0, false));
        }
    }

    /** An operation; a baseline without its own synchronous form is enqueued and then waited for on the benchmark stream. */
    private Op op(Runnable enqueue, Runnable call) {
        return new Op() {
            @Override
            public void enqueue() {
                enqueue.run();
            }

            @Override
            public void call() {
                if (call != null) {
                    call.run();
                } else {
                    enqueue.run();
                    check(cuStreamSynchronize(stream), "cuStreamSynchronize");
                }
            }
        };
    }

    private Rate measure(long bytes, CUstream on, Op op) {
        device.makeCurrent();
        for (int i = 0; i < WARMUP; i++) {
            op.call();
        }
        long[] nanos = new long[ITERATIONS];
        for (int i = 0; i < ITERATIONS; i++) {
            long t0 = System.nanoTime();
            op.call();
            nanos[i] = System.nanoTime() - t0;
        }
        Arrays.sort(nanos);
        double wall = bytes / (nanos[ITERATIONS / 2] / 1e9);
        check(cuEventRecord(start, on), "cuEventRecord(start)");
        for (int i = 0; i < ITERATIONS; i++) {
            op.enqueue();
        }
        check(cuEventRecord(end, on), "cuEventRecord(end)");
        check(cuEventSynchronize(end), "cuEventSynchronize(end)");
        float[] millis = new float[1];
        check(cuEventElapsedTime(millis, start, end), "cuEventElapsedTime");
        return new Rate(wall, bytes * (double) ITERATIONS / (millis[0] / 1e3));
    }

    private void readFold(CUdeviceptr src, long bytes, CUdeviceptr out) {
        int blocks = device.maxBlocks();
        Pointer params = Pointer.to(Pointer.to(src), Pointer.to(new long[] {bytes / 16}), Pointer.to(out));
        check(cuLaunchKernel(device.readFoldFunction(), blocks, 1, 1, KernelAbi.THREADS_PER_BLOCK, 1, 1, 0, stream, params,
                null), "cuLaunchKernel(read fold)");
    }

    private CUdeviceptr alloc(long bytes) {
        CUdeviceptr p = new CUdeviceptr();
        check(cuMemAlloc(p, bytes), "cuMemAlloc(" + bytes + ")");
        return p;
    }
}
