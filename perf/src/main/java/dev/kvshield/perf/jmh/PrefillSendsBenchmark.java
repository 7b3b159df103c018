package dev.kvshield.perf.jmh;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.bridge.handoff.PrefillSends;
import java.nio.LongBuffer;
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
 * What a prefill send's claims add to one request's life on the bridge, Java side only: the request's
 * pages allocated (planned) and released through its {@code free_segment} ({@link #releaseUnsent}, the
 * baseline), against the same with a send between them ({@link #sendThenRelease}: begin, reader claims
 * over {@code chunks} chunks on the page ids the allocation returned (as SGLang hands them to its KV
 * sender), the release while claimed, then the
 * transport's conclusion dropping the claims). Report the same-run ratio.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class PrefillSendsBenchmark {
    private static final int PAGE_SIZE_TOKENS = BridgePool.PAGE_SIZE_TOKENS;
    private static final long PEER = 1;

    @Param({"64"})
    int requestPages;

    @Param({"4"})
    int chunks;

    @Param({"ZERO"})
    String level;

    private BridgePool pool;
    private SlotAllocator allocator;
    private PrefillSends sends;
    private LongBuffer plan;
    private LongBuffer io;
    private int[] chunkPages;
    private int tenant;
    private long request;

    @Setup(Level.Trial)
    public void setUp() {
        pool = new BridgePool(level);
        allocator = pool.allocator;
        plan = pool.plan;
        io = pool.io;
        chunkPages = new int[requestPages];
        sends = new PrefillSends(allocator);
        tenant = allocator.defaultTenant();
    }

    private long allocate() {
        long slots = (long) requestPages * PAGE_SIZE_TOKENS;
        plan.put(0, ++request).put(1, tenant).put(2, 0).put(3, slots).put(4, -1);
        if (allocator.alloc(slots, 1, SlotAllocator.STEP_BOUNDARY) < 0) {
            throw new IllegalStateException("pool exhausted");
        }
        return slots;
    }

    @Benchmark
    public int releaseUnsent() {
        long slots = allocate();
        return allocator.freeSegment(request, 0, slots, tenant, 0);
    }

    @Benchmark
    public int sendThenRelease() {
        long slots = allocate();
        sends.begin(request, tenant, slots, PEER);
        for (int c = 1; c <= chunks; c++) {
            int from = requestPages * (c - 1) / chunks;
            int to = requestPages * c / chunks;
            for (int p = from; p < to; p++) {
                chunkPages[p - from] = (int) (io.get(p * PAGE_SIZE_TOKENS) / PAGE_SIZE_TOKENS);
            }
            sends.claim(request, chunkPages, to - from);
            sends.markSent(request, slots * c / chunks);
        }
        int rejected = allocator.freeSegment(request, 0, slots, tenant, 0);
        sends.complete(request);
        return rejected;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        pool.close();
    }
}
