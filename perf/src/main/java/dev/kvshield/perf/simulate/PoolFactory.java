package dev.kvshield.perf.simulate;

import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.quarantine.QuarantineMode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

/**
 * Builds the pool of a level over shared page memory (the memory outlives the pools, so every level
 * and round runs on the same bytes).
 *
 * @param sealer the key source for ENCRYPT, or {@code null} when none is available
 * @param quarantineMode whether protection runs inside release or on a worker thread
 * @param releaseLagSteps steps a release's protection may take before the step boundary waits for it
 */
public record PoolFactory(PageSealerFactory sealer, QuarantineMode quarantineMode, int releaseLagSteps) {
    public PoolFactory {
        if (quarantineMode == null || releaseLagSteps < 0) {
            throw new IllegalArgumentException("quarantineMode must not be null and releaseLagSteps >= 0: " + quarantineMode + ", "
                    + releaseLagSteps);
        }
    }

    public static PoolFactory synchronous(PageSealerFactory sealer) {
        return new PoolFactory(sealer, QuarantineMode.SYNCHRONOUS, 0);
    }

    /** True if this factory can build {@code level}. */
    public boolean supports(Level level) {
        return level.protection() == null || !level.protection().needsKeySource() || sealer != null;
    }

    /** A fresh pool of {@code level} over {@code memory}, its pages zeroed. */
    public ServingPool create(Level level, PageMemory memory) {
        if (level == Level.STOCK) {
            return new StockPool(memory);
        }
        PoolConfig.Builder config = PoolConfig.builder(memory.geometry()).level(level.protection()).quarantineMode(quarantineMode)
                .releaseLagSteps(releaseLagSteps)
                .poolId("perf-" + level.label())
                // The simulation admits by pages itself; advertising what the pool holds keeps start-up quiet.
                .admission(new AdmissionPolicy(memory.geometry().capacityTokens(), 0, false));
        if (sealer != null) {
            config.sealer(sealer);
        }
        KvPagePool pool = KvPagePool.create(config.build(), memory);
        if (level.protection().requiresAuditTrail()) {
            return new ShieldedPool(level, pool, attachAuditTrail(pool));
        }
        return new ShieldedPool(level, pool, () -> { });
    }

    /**
     * COMPLIANCE audits every life-cycle event (and hands out no page until a trail listens), so its cost includes the trail: hash-chained JSON
     * lines in a temporary directory with an in-memory signing key, deleted when the pool closes.
     */
    public static AutoCloseable attachAuditTrail(KvPagePool pool) {
        try {
            Path dir = Files.createTempDirectory("kvshield-audit-");
            AuditTrail trail = AuditTrail.attach(pool, AuditConfig.builder().sink(AuditSink.rotatingFiles(dir, "audit", 64L << 20))
                    .signingKey(AuditKeys.generateInMemory()).build());
            return () -> {
                trail.close();
                try (Stream<Path> files = Files.walk(dir)) {
                    for (Path f : files.sorted(Comparator.reverseOrder()).toList()) {
                        Files.deleteIfExists(f);
                    }
                }
            };
        } catch (IOException e) {
            throw new UncheckedIOException("cannot create the COMPLIANCE audit trail's directory", e);
        }
    }
}
