package dev.kvshield.quarantine;

/** Where protection work runs. Both modes give the same availability at every step boundary. */
public enum QuarantineMode {
    /** Protection runs inside the call that made the page protectable (release, claim drop). */
    SYNCHRONOUS,
    /** A worker thread protects batches in the background; results show at the next step boundary. */
    ASYNCHRONOUS
}
