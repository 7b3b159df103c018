package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import java.util.List;
import org.junit.jupiter.api.Test;

/** kvshield as shipped: a pinned-seed campaign over every level and both quarantine modes finds nothing, and replays exactly. */
class CleanCampaignTest {
    static final long SEED = 42;
    static final List<ProtectionLevel> LEVELS = List.of(ProtectionLevel.values());

    @Test
    void aPinnedCampaignOnTheCleanBuildFindsNothing() {
        Campaign.Summary s = new Campaign(TraceGenerator.any(LEVELS), FuzzFixtures.clean(), SEED, 600, 90_000_000_000L, false, null,
                System.out).run();
        System.out.println("clean campaign (seed " + SEED + "): " + s.closing().replace('\n', ' '));
        assertTrue(s.traces() >= 100, "too few traces ran in the time budget: " + s.traces());
        assertEquals(List.of(), s.findings(), "findings on the clean build (seed " + SEED + ")");
    }

    @Test
    void traceRunsShowTheirSubjects() {
        // The campaign above is only evidence if traces exercise the paths the planted bugs live on.
        int readBack = 0;
        int rejections = 0;
        int refusals = 0;
        int exhaustions = 0;
        long protectionFailures = 0;
        for (int i = 0; i < 60; i++) {
            RunResult r = FuzzFixtures.RUNNER.run(TraceGenerator.any(LEVELS).generate(Campaign.traceSeed(SEED, i)), Rig.CLEAN);
            readBack += r.readBack().size();
            rejections += r.rejections();
            refusals += r.refusals();
            exhaustions += r.exhaustions();
            protectionFailures += r.protectionFailures();
        }
        assertTrue(readBack > 60, "requests that read back: " + readBack);
        assertTrue(rejections > 10, "late or stale uses the pool refused: " + rejections);
        assertTrue(refusals > 100, "hostile lease batches the pool refused: " + refusals);
        assertTrue(exhaustions > 5, "calls refused because the lease ids ran out: " + exhaustions);
        assertTrue(protectionFailures > 5, "pages whose protection failed (armed faults, raced reclaims): " + protectionFailures);
    }

    @Test
    void aTraceReplaysExactly() {
        for (int i = 0; i < 20; i++) {
            FuzzTrace t = TraceGenerator.any(LEVELS).generate(Campaign.traceSeed(SEED, i));
            assertEquals(t, TraceGenerator.any(LEVELS).generate(Campaign.traceSeed(SEED, i)), "same seed, same trace");
            assertEquals(t, FuzzTrace.parse(t.format()), "the file format round-trips");
            RunResult first = FuzzFixtures.RUNNER.run(t, Rig.CLEAN);
            RunResult second = FuzzFixtures.RUNNER.run(t, Rig.CLEAN);
            assertEquals(first, second, "trace " + i + " replays to the same result");
        }
    }
}
