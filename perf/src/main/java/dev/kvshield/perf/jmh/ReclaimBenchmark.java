package dev.kvshield.perf.jmh;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The CPU cost of a prefix reclaim under ENCRYPT, per page: decrypting a sealed page in place
 * (ChaCha20 over every layer and K/V buffer of the page) and handing it back to its tenant. Each
 * invocation first seals a batch (setup, not timed), then reclaims it.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 4, time = 1)
@Fork(value = 1, jvmArgsAppend = {"--enable-native-access=ALL-UNNAMED", "--add-modules=jdk.incubator.vector",
        "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED"})
@OperationsPerInvocation(ReclaimBenchmark.BATCH)
public class ReclaimBenchmark {
    static final int BATCH = 32;

    /** Bytes per token per buffer (K or V): 8 KV heads x 128 x bf16 = 2048. */
    @Param({"2048"})
    int bytesPerToken;

    private OffHeapPageMemory memory;
    private RootKeySource keys;
    private KvPagePool pool;
    private int tenant;
    private final long[] leases = new long[BATCH];
    private final long[] refs = new long[BATCH];
    private final long[] back = new long[BATCH];
    private long request;

    @Setup(Level.Trial)
    public void setUp() {
        // 4 layers x K/V x 16 tokens: 512 KiB per page at 2048 bytes per token.
        PoolGeometry g = PoolGeometry.builder().mha(4, 1, bytesPerToken / 2, 2).pageSizeTokens(16).pageCount(BATCH + 1).build();
        memory = OffHeapPageMemory.allocate(g);
        keys = RootKeySource.ephemeral();
        pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ENCRYPT).sealer(new HostPageSealerFactory(keys)).build(),
                memory);
        tenant = pool.tenants().register("bench");
    }

    @Setup(Level.Invocation)
    public void sealABatch() {
        long owner = Owners.request(request++);
        if (!pool.allocate(tenant, owner, LeaseKind.OWNER, BATCH, leases, 0)) {
            throw new IllegalStateException(pool.lastShortfall());
        }
        for (int i = 0; i < BATCH; i++) {
            refs[i] = PageHandles.sealedReference(pool.view().handleOf(leases[i]));
        }
        pool.release(tenant, owner, leases, 0, BATCH, ReleaseReason.EVICTED);
        pool.endStep();
    }

    @Benchmark
    public int reclaimBatch() {
        int hits = pool.reclaim(tenant, Owners.request(request), LeaseKind.OWNER, refs, 0, BATCH, back, 0);
        if (hits != BATCH) {
            throw new IllegalStateException("reclaimed " + hits + " of " + BATCH);
        }
        pool.release(tenant, Owners.request(request), back, 0, BATCH, ReleaseReason.FINISHED);
        return hits;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        pool.close();
        keys.close();
        memory.close();
    }
}
