package dev.kvshield.testing;

import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

/**
 * Skips for tests that need something the machine may lack. A missing <em>software</em>
 * dependency (a Debian package, nvcc, the Python side) skips locally but fails when the build runs
 * with {@code -Dkvshield.requireDeps=true} (what CI does), so CI can never pass by skipping. A
 * missing GPU always skips, with the reason stated.
 */
public final class Requirements {
    private Requirements() {}

    public static boolean depsRequired() {
        return Boolean.getBoolean("kvshield.requireDeps");
    }

    /** Skips (or, under {@code kvshield.requireDeps}, fails) unless {@code present}. */
    public static void assumeSoftware(boolean present, String what) {
        if (!present) {
            if (depsRequired()) {
                Assertions.fail("required software missing: " + what + " (kvshield.requireDeps=true turns this skip into a failure)");
            }
            Assumptions.abort("software missing: " + what);
        }
    }

    /** Skips unless a GPU is present; never a failure. */
    public static void assumeGpu(boolean present, String reason) {
        Assumptions.assumeTrue(present, () -> "no GPU: " + reason);
    }
}
