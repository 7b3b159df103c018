package dev.kvshield.perf.jmh;

import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RequestOutcome;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.openjdk.jmh.annotations.AuxCounters;
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
 * The audit trail's cost on one scheduler step of a request: allocate a batch, mark it written,
 * release it, finish the request, pass the step boundary. {@code ZERO}, and {@code COMPLIANCE}
 * with a no-op listener standing in for the trail it requires before any hand-out, against
 * {@code COMPLIANCE_AUDITED} (COMPLIANCE with the trail writing JSON lines to rotating files in a
 * temporary directory, checkpoints every 10 000 records).
 *
 * <p>Counters: {@code pageEvents} is page events audited per second (a step emits
 * {@value #EVENTS_PER_PAGE} per page: allocate, write, release, protect-issued, protect-done, free),
 * {@code records} is record lines written per second. With {@code -prof gc}, bytes allocated per
 * page event are {@code gc.alloc.rate.norm} (bytes per step) over {@value #EVENTS_PER_PAGE} x
 * {@code batchPages}. Formats that wrote one record per event (format 1) show {@code records}
 * about equal to page events. The files go to {@code java.io.tmpdir}: {@code -jvmArgsAppend
 * -Djava.io.tmpdir=/dev/shm} takes the disk (and its fsync at checkpoints) out of the figure.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class AuditTrailBenchmark {
    /** What runs: the level, and whether the audit trail is attached. */
    public enum Mode {
        ZERO,
        COMPLIANCE,
        COMPLIANCE_AUDITED
    }

    @Param({"16"})
    int batchPages;

    /** Token slots per page; each token is 2 layers x K,V x 128 bytes. */
    @Param({"1", "16"})
    int pageSizeTokens;

    @Param({"ZERO", "COMPLIANCE", "COMPLIANCE_AUDITED"})
    Mode mode;

    private OffHeapPageMemory memory;
    private KvPagePool pool;
    private AuditTrail trail;
    private Path dir;
    private int tenant;
    private long[] leases;
    private long request;

    /** Page events a step emits per page of its batch. */
    static final int EVENTS_PER_PAGE = 6;

    /** Page events audited and record lines written, reported per second next to the step rate. */
    @State(Scope.Thread)
    @AuxCounters(AuxCounters.Type.OPERATIONS)
    public static class Records {
        public long pageEvents;
        public long records;

        @Setup(Level.Iteration)
        public void reset() {
            pageEvents = 0;
            records = 0;
        }
    }

    @Setup(Level.Trial)
    public void setUp() throws IOException {
        PoolGeometry g = PoolGeometry.builder().mha(2, 1, 64, 2).pageSizeTokens(pageSizeTokens).pageCount(4 * batchPages + 1).build();
        memory = OffHeapPageMemory.allocate(g);
        ProtectionLevel level = mode == Mode.ZERO ? ProtectionLevel.ZERO : ProtectionLevel.COMPLIANCE;
        pool = KvPagePool.create(PoolConfig.builder(g).level(level).build(), memory);
        if (mode == Mode.COMPLIANCE_AUDITED) {
            dir = Files.createTempDirectory("kvshield-audit-bench");
            trail = AuditTrail.attach(pool, AuditConfig.builder().sink(AuditSink.rotatingFiles(dir, "audit", 64L << 20))
                    .signingKey(AuditKeys.generateInMemory()).build());
        } else if (mode == Mode.COMPLIANCE) {
            pool.attachAuditTrail((type, page, generation, t, holder, detail) -> { });
        }
        tenant = pool.tenants().register("bench");
        leases = new long[batchPages];
    }

    @Benchmark
    public int step(Records counter) {
        long id = request++ & 0xFFFF_FFFFL;
        long owner = Owners.request(id);
        if (!pool.allocate(tenant, owner, LeaseKind.OWNER, batchPages, leases, 0)) {
            throw new IllegalStateException(pool.lastShortfall());
        }
        for (int i = 0; i < batchPages; i++) {
            pool.markWritten(tenant, owner, leases[i], 0, pageSizeTokens);
        }
        pool.release(tenant, owner, leases, 0, batchPages, ReleaseReason.FINISHED);
        if (trail != null) {
            trail.requestFinished(tenant, id, RequestOutcome.COMPLETED);
        }
        long recordsBefore = trail == null ? 0 : trail.recordsWritten();
        long eventsBefore = trail == null ? 0 : trail.pageEventsWritten();
        int made = pool.endStep();
        if (trail != null) {
            counter.records += trail.recordsWritten() - recordsBefore;
            counter.pageEvents += trail.pageEventsWritten() - eventsBefore;
        }
        return made;
    }

    @TearDown(Level.Iteration)
    public void checkTrail() {
        if (trail != null && trail.failure() != null) {
            throw new IllegalStateException(trail.failure());
        }
    }

    @TearDown(Level.Trial)
    public void tearDown() throws IOException {
        if (trail != null) {
            trail.close();
            try (Stream<Path> files = Files.walk(dir)) {
                files.sorted(Comparator.reverseOrder()).forEach(p -> {
                    try {
                        Files.delete(p);
                    } catch (IOException e) {
                        throw new UncheckedIOException(e);
                    }
                });
            }
        }
        pool.close();
        memory.close();
    }
}
