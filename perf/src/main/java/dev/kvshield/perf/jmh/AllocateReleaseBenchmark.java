package dev.kvshield.perf.jmh;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
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
 * One scheduler step's bookkeeping: allocate a batch of pages for a request (one owner lease each),
 * release it, pass the step boundary. Level NONE isolates the guards' cost; ZERO adds the scrub of
 * tiny pages, ENCRYPT the seal (tenant-keys' CPU sealer over an ephemeral key), COMPLIANCE the
 * verify (with a no-op listener standing in for the audit trail it requires; AuditTrailBenchmark
 * measures the trail). Run with {@code -prof gc} to see the allocation rate of the path (expected
 * ~0 B/op).
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = {"--enable-native-access=ALL-UNNAMED", "--add-modules=jdk.incubator.vector",
        "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED"})
public class AllocateReleaseBenchmark {
    @Param({"64"})
    int batchPages;

    @Param({"NONE", "ZERO", "ENCRYPT", "COMPLIANCE"})
    ProtectionLevel level;

    private OffHeapPageMemory memory;
    private KvPagePool pool;
    private int tenant;
    private long[] leases;
    private long request;

    @Setup(Level.Trial)
    public void setUp() {
        // Tiny pages (one 16-byte token per buffer, 2 buffers) so the bookkeeping, not the scrub, dominates.
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 8, 2).pageSizeTokens(1).pageCount(4 * batchPages + 1).build();
        memory = OffHeapPageMemory.allocate(g);
        PoolConfig.Builder config = PoolConfig.builder(g).level(level);
        if (level.needsKeySource()) {
            Availability<PageSealerFactory> sealer = Sealers.hostSealer();
            if (!sealer.available()) {
                throw new IllegalStateException("level ENCRYPT cannot run: " + sealer.reason());
            }
            config.sealer(sealer.value());
        }
        pool = KvPagePool.create(config.build(), memory);
        if (level.requiresAuditTrail()) {
            pool.attachAuditTrail((type, page, generation, t, holder, detail) -> { });
        }
        tenant = pool.tenants().register("bench");
        leases = new long[batchPages];
    }

    @Benchmark
    public int allocateReleaseStep() {
        long owner = Owners.request(request++ & 0xFFFF_FFFFL);
        if (!pool.allocate(tenant, owner, LeaseKind.OWNER, batchPages, leases, 0)) {
            throw new IllegalStateException(pool.lastShortfall());
        }
        pool.release(tenant, owner, leases, 0, batchPages, ReleaseReason.FINISHED);
        return pool.endStep();
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        pool.close();
        memory.close();
    }
}
