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
 * One request's life on SGLang's token allocator ({@code page_size == 1}), Java side only, as the
 * plug-in drives it per step: the step boundary on the allocation's call, the request's planned
 * allocation of {@code tokens} one-slot pages (its page list kept, its tokens recorded as written),
 * then its release in one call (free of its slots, end of its deferred frees, leftovers). Divided by
 * {@code tokens}, the pool's cost per one-slot page: what {@code bench_token_alloc.py} pays on top of
 * Python and JPype. Run with {@code -prof gc}: it should allocate ~0 B/op.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class TokenRequestBenchmark {
    @Param({"128", "1024"})
    int tokens;

    @Param({"NONE"})
    String level;

    private BridgePool pool;
    private SlotAllocator allocator;
    private int tenant;
    private long request;

    @Setup(Level.Trial)
    public void setUp() {
        pool = new BridgePool(level, 1);
        allocator = pool.allocator;
        tenant = allocator.tenantId("bench");
    }

    @Benchmark
    public int requestLife() {
        long req = ++request;
        pool.plan.put(0, req).put(1, tenant).put(2, 0).put(3, tokens).put(4, -1);
        if (allocator.alloc(tokens, 1, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return allocator.releaseRequest(tokens, tenant, req, true, 0) + (int) pool.io.get(0);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        pool.close();
    }
}
