package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * Key-epoch retirement in the middle of a reclaim: ENCRYPT traces with every armed backend fault
 * taken out, so every protection failure is a reclaim whose second key epoch an operator retired or
 * broke right after the first was unsealed in place. The clean build fails such a reclaim whole
 * (nothing handed out) and scrubs and retires every page it touched; with a backend whose scrub of
 * failed pages zeroes nothing (the twin), the retired pages keep the tenant's plaintext and the
 * retired-pages oracle must say so.
 */
class EpochRaceTest {
    static final long SEED = 5;
    static final int TRACES = 150;
    static final int MAX_TRACES = 2500;
    static final TraceGenerator ENCRYPT = TraceGenerator.fixed(ProtectionLevel.ENCRYPT, QuarantineMode.SYNCHRONOUS);

    static FuzzTrace withoutFaults(FuzzTrace t) {
        return t.withEvents(t.events().stream().filter(e -> e.action() != FuzzTrace.Action.FAULT).toList());
    }

    @Test
    void theCleanBuildRetiresAndZeroesEveryPageAFailedReclaimTouched() {
        long failures = 0;
        for (int i = 0; i < TRACES; i++) {
            FuzzTrace trace = withoutFaults(ENCRYPT.generate(Campaign.traceSeed(SEED, i)));
            Fuzzer.Check c = FuzzFixtures.clean().check(trace);
            assertEquals(List.of(), c.findings(), "trace seed " + Campaign.traceSeed(SEED, i));
            failures += c.result().protectionFailures();
        }
        assertTrue(failures > 0, "no reclaim failed in the middle: the races never hit a reclaim of two epochs");
    }

    @Test
    void aScrubOfFailedPagesThatZeroesNothingIsFound() {
        Fuzzer planted = FuzzFixtures.fuzzer(PlantedRigs::lyingScrubOfFailedPages);
        long start = System.nanoTime();
        for (int i = 0; i < MAX_TRACES; i++) {
            FuzzTrace trace = withoutFaults(ENCRYPT.generate(Campaign.traceSeed(SEED, i)));
            Fuzzer.Check c = planted.check(trace);
            if (!c.clean()) {
                System.out.printf("planted bug 'scrub of failed pages zeroes nothing' under epoch races: found after %d traces in %.2f s"
                        + " (%s)%n", i + 1, (System.nanoTime() - start) / 1e9, c.findings().get(0));
                assertEquals(Finding.Kind.RESIDUE, c.findings().get(0).kind(), c.findings().toString());
                assertTrue(FuzzFixtures.clean().check(trace).clean(), "without the planted bug the same trace is clean");
                return;
            }
        }
        throw new AssertionError("the planted bug was not found in " + MAX_TRACES + " traces (seed " + SEED + ")");
    }
}
