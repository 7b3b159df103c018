package dev.kvshield.perf.jmh;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.Map;
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
    private static final int PAGE_SIZE_TOKENS = 16;

    @Param({"8", "64"})
    int batchPages;

    @Param({"NONE", "ZERO"})
    String level;

    private OffHeapPageMemory memory;
    private SlotAllocator allocator;
    private LongBuffer io;
    private LongBuffer plan;

    @Setup(Level.Trial)
    public void setUp() {
        // One 4-byte token per buffer so the bookkeeping, not the scrub, dominates.
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(PAGE_SIZE_TOKENS).pageCount(4097).build();
        memory = OffHeapPageMemory.allocate(g);
        allocator = SlotAllocator.create(Map.of("level", level, "advertisedContextTokens", "65536"), g, memory);
        ByteBuffer ioBuffer = ByteBuffer.allocateDirect(4097 * PAGE_SIZE_TOKENS * 8).order(ByteOrder.nativeOrder());
        ByteBuffer planBuffer = ByteBuffer.allocateDirect(SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
        allocator.bind(ioBuffer, planBuffer);
        io = ioBuffer.asLongBuffer();
        plan = planBuffer.asLongBuffer();
    }

    @Benchmark
    public int allocFreeStep() {
        long slots = (long) batchPages * PAGE_SIZE_TOKENS;
        if (allocator.alloc(slots, 0, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return allocator.free((int) slots, -1, 0) + (int) io.get(0);
    }

    @Benchmark
    public int allocFreeSegmentStep() {
        long slots = (long) batchPages * PAGE_SIZE_TOKENS;
        int tenant = allocator.defaultTenant();
        plan.put(0, 1).put(1, tenant).put(2, 0).put(3, slots).put(4, -1);
        if (allocator.alloc(slots, 1, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return allocator.freeSegment(1, 0, slots, tenant, 0) + (int) io.get(0);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        allocator.close();
        memory.close();
    }
}
