package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import java.io.IOException;
import java.nio.file.Path;
import java.util.Set;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Each planted bug must be found by a pinned-seed campaign within its trace budget; the minimised
 * trace it writes must replay the finding with the bug and be clean without it (the twin).
 * Time to find is printed for the report.
 */
class PlantedBugsTest {
    static final long SEED = 3;
    static final long MAX_TRACES = 2500;

    @TempDir
    Path dir;

    @Test
    void skippedScrubIsFoundByTheResidueOracle() throws IOException {
        find("skip the scrub", PlantedRigs::skipScrub, TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS),
                Set.of(Finding.Kind.RESIDUE, Finding.Kind.LEAK));
    }

    /**
     * An old sealed reference reclaims whatever the page holds now: another request's KV served as
     * the prefix (LEAK), or, when that request wrote only part of the page, a read of the prefix the
     * written-extent guard refuses (CORRUPT: the prefix reader cannot read its own prefix).
     */
    @Test
    void skippedGenerationBumpIsFound() throws IOException {
        find("skip the generation bump", PlantedRigs::skipGenerationBump,
                TraceGenerator.fixed(ProtectionLevel.ENCRYPT, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.LEAK, Finding.Kind.CORRUPT));
    }

    /** Found where the free by pages answers: the leases it found are not the holds the trace released. */
    @Test
    void aFreeByPagesOnePageShortIsFound() throws IOException {
        find("free by pages one page short", PlantedRigs::releaseOnePageShort,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.INVARIANT));
    }

    /** Found by the holds oracle as the timeout fires (the claims are gone while the model keeps them fenced), or by the bytes later. */
    @Test
    void freeOnClaimTimeoutIsFound() throws IOException {
        find("free on claim timeout", PlantedRigs::freeOnClaimTimeout,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS),
                Set.of(Finding.Kind.HOLDS, Finding.Kind.RESIDUE, Finding.Kind.LEAK, Finding.Kind.CORRUPT));
    }

    @Test
    void transferAcceptedWithUnwrittenPagesIsFound() throws IOException {
        find("accept a transfer with unwritten pages", PlantedRigs::acceptUnwrittenTransfer,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.CORRUPT));
    }

    @Test
    void handOutBeforeAsynchronousProtectionCompletedIsFound() throws IOException {
        find("hand out before protection completed (async)", PlantedRigs::handOutBeforeProtectionCompleted,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.ASYNCHRONOUS),
                Set.of(Finding.Kind.RESIDUE, Finding.Kind.CORRUPT, Finding.Kind.LEAK));
    }

    @Test
    void batchesSplitIntoSingleCallsAreFoundByTheAllOrNothingOracle() throws IOException {
        find("split batches (per-id calls)", PlantedRigs::splitBatches, TraceGenerator.fixed(ProtectionLevel.ZERO,
                QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.ATOMICITY));
    }

    @Test
    void batchesDeduplicatedByTheAdapterAreFoundByTheRefusalOracle() throws IOException {
        find("deduplicate batches", PlantedRigs::dedupBatches, TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS),
                Set.of(Finding.Kind.REFUSAL));
    }

    @Test
    void aConfusedDeputyIsFoundByTheRefusalOracle() throws IOException {
        find("confused deputy (retry as the lease's holder)", PlantedRigs::confusedDeputy,
                TraceGenerator.fixed(ProtectionLevel.NONE, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.REFUSAL));
    }

    @Test
    void idsRecycledAtExhaustionAreFoundByTheIdsOracle() throws IOException {
        find("recycle claim ids when the pool runs out", PlantedRigs::recycleIdsWhenExhausted,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.IDS));
    }

    @Test
    void anUnmatchThatReleasesTheCachesLeaseIsFound() throws IOException {
        find("unmatch releases the cache's lease", PlantedRigs::unmatchReleasesTheCachesLease,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.ATOMICITY));
    }

    @Test
    void aBackendFaultReportedAsDoneIsFoundByTheResidueOracle() throws IOException {
        find("a fault mid-batch reported as done", PlantedRigs::faultReportedAsDone,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.RESIDUE, Finding.Kind.LEAK));
    }

    @Test
    void aLyingScrubOfFailedPagesIsFoundByTheRetiredPagesOracle() throws IOException {
        find("the scrub of failed pages zeroes nothing", PlantedRigs::lyingScrubOfFailedPages,
                TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS), Set.of(Finding.Kind.RESIDUE));
    }

    private void find(String bug, Supplier<Rig> planted, TraceGenerator generator, Set<Finding.Kind> kinds) throws IOException {
        Fuzzer fuzzer = FuzzFixtures.fuzzer(planted);
        Campaign.Summary s = new Campaign(generator, fuzzer, SEED, MAX_TRACES, 120_000_000_000L, true, dir, null).run();
        assertEquals(1, s.findings().size(), "planted bug '" + bug + "' not found in " + s.traces() + " traces (seed " + SEED + ")");
        Campaign.Found f = s.findings().get(0);
        System.out.printf("planted bug '%s': found after %d traces in %.2f s (%s; minimised to %d requests, %d events)%n", bug,
                s.tracesToFirstFinding(), s.firstFindingNanos() / 1e9, f.finding().kind(), f.minimized().requests().size(),
                f.minimized().events().size());
        assertTrue(kinds.contains(f.finding().kind()), "finding of an unexpected kind: " + f.finding());
        FuzzTrace replayed = FuzzTrace.read(f.file());
        assertEquals(f.minimized(), replayed, "the written trace parses back to the minimised one");
        assertTrue(fuzzer.check(replayed).has(f.finding().kind()), "the replay reproduces the finding");
        Fuzzer.Check clean = FuzzFixtures.clean().check(replayed);
        assertTrue(clean.clean(), "without the planted bug the same trace is clean: " + clean.findings());
        assertFalse(replayed.events().isEmpty());
    }
}
