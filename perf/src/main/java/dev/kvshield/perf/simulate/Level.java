package dev.kvshield.perf.simulate;

import dev.kvshield.protection.ProtectionLevel;
import java.util.Arrays;
import java.util.Locale;

/**
 * What the report compares: {@link #STOCK}, a plain shared pool modelled on SGLang's allocator (the
 * yardstick), and every kvshield {@link ProtectionLevel}.
 */
public enum Level {
    STOCK(null),
    NONE(ProtectionLevel.NONE),
    ZERO(ProtectionLevel.ZERO),
    ENCRYPT(ProtectionLevel.ENCRYPT),
    COMPLIANCE(ProtectionLevel.COMPLIANCE);

    private final ProtectionLevel protection;

    Level(ProtectionLevel protection) {
        this.protection = protection;
    }

    /** The kvshield level, or {@code null} for {@link #STOCK}. */
    public ProtectionLevel protection() {
        return protection;
    }

    public String label() {
        return name().toLowerCase(Locale.ROOT);
    }

    /** Parses a level name case-insensitively; the error lists the allowed values. */
    public static Level parse(String name) {
        for (Level l : values()) {
            if (l.name().equalsIgnoreCase(name == null ? "" : name.trim())) {
                return l;
            }
        }
        throw new IllegalArgumentException("unknown level '" + name + "'; allowed: "
                + Arrays.toString(values()).toLowerCase(Locale.ROOT));
    }
}
