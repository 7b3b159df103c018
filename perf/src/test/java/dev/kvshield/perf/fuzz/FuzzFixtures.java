package dev.kvshield.perf.fuzz;

import dev.kvshield.perf.simulate.Sealers;
import java.util.function.Supplier;

/** The runner every fuzz test shares (one ENCRYPT key source per test JVM) and fuzzers over it. */
final class FuzzFixtures {
    static final TraceRunner RUNNER = new TraceRunner(Sealers.hostSealer().value());

    private FuzzFixtures() {}

    static Fuzzer fuzzer(Supplier<Rig> rigs) {
        return new Fuzzer(RUNNER, rigs);
    }

    static Fuzzer clean() {
        return fuzzer(() -> Rig.CLEAN);
    }
}
