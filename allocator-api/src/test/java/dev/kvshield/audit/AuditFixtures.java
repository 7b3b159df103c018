package dev.kvshield.audit;

import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/** Builds real audit trails on tiny pools for the audit tests. */
final class AuditFixtures {
    /** Bytes per token of one buffer in {@link TestPools#tinyGeometry}. */
    static final int TOKEN_BYTES = 8;

    private AuditFixtures() {}

    static AuditConfig.Builder config(Path dir, AuditKeys.SigningKey key, long maxFileBytes) throws IOException {
        return AuditConfig.builder().sink(AuditSink.rotatingFiles(dir, "audit", maxFileBytes)).signingKey(key);
    }

    /**
     * Runs {@code rounds} rounds of two tenants writing, reading and releasing pages on a 9-page
     * pool with the trail attached, then closes the trail. Deterministic.
     */
    static void runScenario(KvPagePool pool, AuditTrail trail, int rounds) {
        int a = pool.tenants().register("alice");
        int b = pool.tenants().register("bob");
        long[] handles = new long[2];
        try (Arena arena = Arena.ofConfined()) {
            for (int round = 0; round < rounds; round++) {
                int tenant = round % 2 == 0 ? a : b;
                long request = 100 + round;
                long owner = Owners.request(request);
                pool.allocate(tenant, owner, LeaseKind.OWNER, 2, handles, 0);
                for (long h : handles) {
                    int page = pool.view().pageOf(h);
                    pool.write(tenant, owner, h, 0, 0, Patterns.fill(arena, 4L * TOKEN_BYTES, tenant, request, page, 0));
                    pool.read(tenant, owner, h, 0, 0, arena.allocate(4L * TOKEN_BYTES));
                }
                pool.release(tenant, owner, handles, 0, 2, ReleaseReason.FINISHED);
                trail.requestFinished(tenant, request, RequestOutcome.COMPLETED);
                pool.endStep();
            }
        }
    }

    /** A closed trail of a COMPLIANCE scenario in {@code dir}, rotated across several files. */
    static void closedTrail(Path dir, AuditKeys.SigningKey key, int rounds) throws IOException {
        closedTrail(dir, key, rounds, null);
    }

    /** As {@link #closedTrail(Path, AuditKeys.SigningKey, int)}, shipping checkpoints to {@code shipped} if not null. */
    static void closedTrail(Path dir, AuditKeys.SigningKey key, int rounds, Path shipped) throws IOException {
        try (TestPools t = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            AuditConfig.Builder b = config(dir, key, 4096).checkpointEveryRecords(25);
            if (shipped != null) {
                b.shipper(CheckpointShipper.appendingTo(shipped));
            }
            AuditTrail trail = AuditTrail.attach(t.pool, b.build());
            runScenario(t.pool, trail, rounds);
            trail.close();
        }
    }

    static List<Path> files(Path dir) throws IOException {
        return AuditLog.files(List.of(dir));
    }

    /** Every line of every file of the trail, in order. */
    static List<String> allLines(Path dir) throws IOException {
        List<String> lines = new ArrayList<>();
        for (Path f : files(dir)) {
            lines.addAll(Files.readAllLines(f, StandardCharsets.UTF_8));
        }
        return lines;
    }

    /** The file and line index holding the record with sequence number {@code seq}. */
    record Location(Path file, int index) {}

    static Location locate(Path dir, long seq) throws IOException {
        for (Path f : files(dir)) {
            List<String> lines = Files.readAllLines(f, StandardCharsets.UTF_8);
            for (int i = 0; i < lines.size(); i++) {
                if (lines.get(i).startsWith("{\"seq\":" + seq + ",")) {
                    return new Location(f, i);
                }
            }
        }
        throw new AssertionError("no record with seq " + seq + " in " + dir);
    }

    static void rewrite(Path file, List<String> lines) throws IOException {
        Files.write(file, lines, StandardCharsets.UTF_8);
    }

    static void copyTree(Path from, Path to) throws IOException {
        Files.createDirectories(to);
        for (Path f : files(from)) {
            Files.copy(f, to.resolve(f.getFileName()));
        }
    }

    static MemorySegment canary(Arena arena, long bytes, byte value) {
        return arena.allocate(bytes).fill(value);
    }
}
