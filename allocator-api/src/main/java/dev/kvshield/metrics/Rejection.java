package dev.kvshield.metrics;

import java.util.Locale;

/** Kinds of rejected misuse, the {@code reason} tag of {@link MetricNames#REJECTIONS}. */
public enum Rejection {
    STALE,
    DOUBLE_FREE,
    FOREIGN,
    INVALID,
    REVOKED_CLAIM,
    UNKNOWN_TENANT;

    public String tag() {
        return name().toLowerCase(Locale.ROOT);
    }
}
