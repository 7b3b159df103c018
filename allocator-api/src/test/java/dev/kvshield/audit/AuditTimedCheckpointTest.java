package dev.kvshield.audit;

import static dev.kvshield.audit.PageEventType.ALLOCATE;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link AuditConfig#checkpointEveryMillis()}: a process killed without closing (SGLang's shutdown kills its
 * schedulers) leaves at most that long of records unsigned. Driven by a controlled monotonic clock.
 */
class AuditTimedCheckpointTest {
    @TempDir
    Path dir;

    private final AtomicLong monoNanos = new AtomicLong(1_000_000_000L);

    private List<String> checkpointsAfterSteps(long everyMillis) throws IOException {
        AuditConfig config = AuditFixtures.config(dir, AuditKeys.generateInMemory(), 1 << 20).handOffMinStepMicros(0)
                .checkpointEveryMillis(everyMillis).build();
        AuditTrail t = AuditTrail.detached(config, new AuditTrail.Scope("pool-t", 0, 8, 4, ProtectionLevel.NONE, i -> "t" + i),
                monoNanos::get, 0L, "trail-t");
        for (int step = 1; step <= 6; step++) {
            t.onPageEvent(ALLOCATE, step, 0, 0, Owners.request(step), 0);
            monoNanos.addAndGet(400_000_000L); // 0.4 s per step
            t.onStepBoundary(step);
        }
        t.flush();
        // NOTE: no close: the process is killed here; what the files hold is what a killed server leaves
        return AuditFixtures.allLines(dir).stream().filter(l -> l.contains("\"type\":\"checkpoint\"")).toList();
    }

    @Test
    void aCheckpointIsSignedAtTheFirstStepBoundaryPastTheInterval() throws IOException {
        List<String> checkpoints = checkpointsAfterSteps(1_000);
        // 6 steps of 0.4 s: due at 1.2 s and 2.4 s after the opening
        assertEquals(2, checkpoints.size(), checkpoints::toString);
        assertTrue(checkpoints.get(0).contains("\"step\":3") && checkpoints.get(1).contains("\"step\":6"), checkpoints::toString);
        assertTrue(checkpoints.stream().allMatch(l -> l.contains("\"final\":false")), checkpoints::toString);
    }

    @Test
    void twinWithoutTheIntervalAKilledTrailHasNoCheckpoint() throws IOException {
        assertEquals(List.of(), checkpointsAfterSteps(0));
    }

    @Test
    void aNegativeIntervalIsRefusedNamingIt() throws IOException {
        AuditConfig.Builder config = AuditFixtures.config(dir, AuditKeys.generateInMemory(), 1 << 20).checkpointEveryMillis(-1);
        assertTrue(assertThrows(IllegalArgumentException.class, config::build).getMessage().contains("checkpointEveryMillis=-1"));
    }
}
