package dev.kvshield.audit;

/** Why an owner released pages; recorded with every release event. */
public enum ReleaseReason {
    FINISHED,
    ABORTED,
    REJECTED,
    TIMEOUT,
    EVICTED
}
