package dev.kvshield.perf.jmh;

import dev.kvshield.bridge.SlotAllocator;
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
 * The sglang-bridge facade's share of one scheduler step, Java side only: SGLang's {@code alloc} of
 * a batch of pages (token slots written to the shared buffer, step boundary on the call), then its
 * {@code free} of those slots; and the attributed form: the allocation planned for one request
 * (its pages kept in its page list) and released through the request's {@code free_segment}, which
 * names the pages from that list. Run with {@code -prof gc}: both paths should allocate ~0 B/op.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class BridgeSlotBenchmark {
    @Param({"8", "64"})
    int batchPages;

    @Param({"NONE", "ZERO"})
    String level;

    private BridgePool pool;
    private SlotAllocator allocator;

    @Setup(Level.Trial)
    public void setUp() {
        pool = new BridgePool(level);
        allocator = pool.allocator;
    }

    @Benchmark
    public int allocFreeStep() {
        long slots = (long) batchPages * BridgePool.PAGE_SIZE_TOKENS;
        if (allocator.alloc(slots, 0, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return allocator.free((int) slots, allocator.defaultTenant(), -1, 0) + (int) pool.io.get(0);
    }

    @Benchmark
    public int allocFreeSegmentStep() {
        long slots = (long) batchPages * BridgePool.PAGE_SIZE_TOKENS;
        int tenant = allocator.defaultTenant();
        pool.plan.put(0, 1).put(1, tenant).put(2, 0).put(3, slots).put(4, -1);
        if (allocator.alloc(slots, 1, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return allocator.freeSegment(1, 0, slots, tenant, 0) + (int) pool.io.get(0);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        pool.close();
    }
}
