package dev.kvshield.protection;

import java.util.Arrays;
import java.util.Locale;

/**
 * What a pool does to a page between owners. Guards (generations, ownership, claims, written
 * extent, admission and handoff checks) are on at every level; levels differ only in what is done
 * to the bytes.
 */
public enum ProtectionLevel {
    /** No scrub; every guard on. Its cost is the guards' cost. */
    NONE,
    /** Zero the page on release. */
    ZERO,
    /**
     * XOR the page with the owning tenant's ChaCha20 keystream on release; the owner may reclaim
     * (decrypt) it for a prefix hit; anyone else gets it zeroed at hand-out. Needs a
     * {@link PageSealer}.
     */
    ENCRYPT,
    /** {@link #ZERO}, then verify every byte is zero before reuse; a page that fails is retired. */
    COMPLIANCE;

    /** Parses a level name case-insensitively; the error lists the allowed values. */
    public static ProtectionLevel parse(String name) {
        for (ProtectionLevel level : values()) {
            if (level.name().equalsIgnoreCase(name == null ? "" : name.trim())) {
                return level;
            }
        }
        throw new IllegalArgumentException("unknown protection level '" + name + "'; allowed: "
                + Arrays.toString(values()).toLowerCase(Locale.ROOT));
    }

    /** True if this level zeroes released pages itself. */
    public boolean scrubsOnRelease() {
        return this == ZERO || this == COMPLIANCE;
    }
}
