package dev.kvshield.audit;

/** How a request ended, as the engine reports it to {@link AuditTrail#requestFinished}. */
public enum RequestOutcome {
    COMPLETED,
    ABORTED,
    REJECTED,
    TIMED_OUT,
    FAILED
}
