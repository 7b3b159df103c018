package dev.kvshield.perf.jmh;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.TenantRegistry;
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
 * ENCRYPT's seal of a scattered page batch (tenant-keys' CPU sealer) against the same run's limits
 * over the same byte count: the raw ChaCha20 XOR over one contiguous region, and a contiguous fill.
 * GB/s = ops/s x batchBytes.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = {"--enable-native-access=ALL-UNNAMED", "--add-modules=jdk.incubator.vector",
        "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED"})
public class SealBandwidthBenchmark {
    /** Bytes of one page in one buffer. */
    @Param({"65536"})
    int pageBytes;

    /** Pages in one release batch; the batch covers 2 layers x K/V. */
    @Param({"32"})
    int batchPages;

    private OffHeapPageMemory memory;
    private PageSealer sealer;
    private int[] pages;
    private int[] generations;
    private Arena arena;
    private MemorySegment contiguous;
    private MemorySegment key;
    private Sealers.RawCipher chacha20;
    private final int[] nonce = {1, 2, 3};

    @Setup(Level.Trial)
    public void setUp() {
        Availability<PageSealerFactory> factory = Sealers.hostSealer();
        if (!factory.available()) {
            throw new IllegalStateException("no sealer: " + factory.reason());
        }
        int poolPages = batchPages * 2 + 1;
        PoolGeometry g = PoolGeometry.builder().mha(2, 1, pageBytes / 16 / 2, 2).pageSizeTokens(16).pageCount(poolPages).build();
        memory = OffHeapPageMemory.allocate(g);
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        tenants.register("bench");
        sealer = factory.value().create(new PageSealerFactory.Context("bench", 0, g, memory, tenants));
        pages = new int[batchPages];
        generations = new int[batchPages];
        SplittableRandom random = new SplittableRandom(1);
        for (int i = 0; i < batchPages; i++) {
            pages[i] = 1 + 2 * i + random.nextInt(2);
        }
        arena = Arena.ofShared();
        contiguous = arena.allocate((long) batchPages * pageBytes * 4, 64);
        key = arena.allocate(32, 16);
        chacha20 = Sealers.rawChaCha20();
    }

    /** Seals the batch at the next generation (a page is never sealed twice at one generation). */
    @Benchmark
    public int sealScatteredBatch() {
        for (int i = 0; i < batchPages; i++) {
            generations[i]++;
        }
        return sealer.seal(0, pages, generations, 0, batchPages);
    }

    @Benchmark
    public void rawChaCha20Contiguous() {
        chacha20.xor(key, nonce, 0L, contiguous);
    }

    @Benchmark
    public void fillContiguous() {
        contiguous.fill((byte) 0);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        sealer.close();
        memory.close();
        arena.close();
    }
}
