package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;
import java.util.Arrays;
import java.util.Locale;

/**
 * What a pool does to a page between owners. Guards (generations, leases, claims, written extent,
 * admission and handoff checks) are on at every level; levels differ only in what is done to the
 * bytes, and each level is one {@link Protection} class ({@link #bind}).
 */
public enum ProtectionLevel {
    /** No scrub; every guard on. Its cost is the guards' cost. */
    NONE {
        @Override
        public Protection bind(PageMemory memory, PageSealer sealer) {
            return new NoProtection(memory);
        }
    },
    /** Zero the page on release. */
    ZERO {
        @Override
        public Protection bind(PageMemory memory, PageSealer sealer) {
            return new ZeroProtection(memory);
        }

        @Override
        public boolean scrubsOnRelease() {
            return true;
        }
    },
    /**
     * XOR the page with the owning tenant's ChaCha20 keystream on release; the owner may reclaim
     * (decrypt) it for a prefix hit; anyone else gets it zeroed at hand-out. Needs a
     * {@link PageSealer}.
     */
    ENCRYPT {
        @Override
        public Protection bind(PageMemory memory, PageSealer sealer) {
            return new SealProtection(memory, sealer);
        }

        @Override
        public boolean needsKeySource() {
            return true;
        }
    },
    /** {@link #ZERO}, then verify every byte is zero before reuse; a page that fails is retired. */
    COMPLIANCE {
        @Override
        public Protection bind(PageMemory memory, PageSealer sealer) {
            return new VerifiedZeroProtection(memory);
        }

        @Override
        public boolean scrubsOnRelease() {
            return true;
        }

        @Override
        public boolean requiresAuditTrail() {
            return true;
        }
    };

    /** Why a level that seals cannot start without a key source. */
    public static final String NO_SEALER_MESSAGE = "protection level ENCRYPT needs a key source: configure a PageSealer"
            + " (tenant-keys provides one) with PoolConfig.Builder.sealer(...)";

    /** This level's strategy over a pool's memory and key source ({@code sealer} may be null unless {@link #needsKeySource}). */
    public abstract Protection bind(PageMemory memory, PageSealer sealer);

    /** True if this level zeroes released pages itself. */
    public boolean scrubsOnRelease() {
        return false;
    }

    /** Whether pages handed to a tenant at this level are audited: hand-outs wait until an audit trail listens. */
    public boolean requiresAuditTrail() {
        return false;
    }

    /** Whether this level needs a {@link PageSealer} (a key source). */
    public boolean needsKeySource() {
        return false;
    }

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
}
