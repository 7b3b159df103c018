package dev.kvshield.perf.jmh;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The off-heap backend's scrub of a scattered page batch against the same run's limit: one
 * {@link MemorySegment#fill} over one contiguous region of the same byte count. Both touch
 * {@code batchBytes} per operation; GB/s = ops/s x batchBytes.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class ScrubBandwidthBenchmark {
    /** Bytes of one page in one buffer (token slots x bytes per token). */
    @Param({"65536", "262144"})
    int pageBytes;

    /** Pages in one release batch; the batch covers 2 layers x K/V. */
    @Param({"64"})
    int batchPages;

    private OffHeapPageMemory memory;
    private int[] pages;
    private Arena arena;
    private MemorySegment contiguous;

    @Setup(Level.Trial)
    public void setUp() {
        int poolPages = batchPages * 4 + 1;
        PoolGeometry g = PoolGeometry.builder().mha(2, 1, pageBytes / 16 / 2, 2).pageSizeTokens(16).pageCount(poolPages).build();
        memory = OffHeapPageMemory.allocate(g);
        pages = new int[batchPages];
        SplittableRandom random = new SplittableRandom(1);
        for (int i = 0; i < batchPages; i++) {
            pages[i] = 1 + random.nextInt(poolPages - 1);
        }
        arena = Arena.ofShared();
        contiguous = arena.allocate(batchBytes(), 64);
    }

    long batchBytes() {
        return (long) batchPages * pageBytes * 4;
    }

    @Benchmark
    public void scrubScatteredBatch() {
        memory.scrub(pages, 0, batchPages);
    }

    @Benchmark
    public void fillContiguousRegion() {
        contiguous.fill((byte) 0);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        memory.close();
        arena.close();
    }
}
