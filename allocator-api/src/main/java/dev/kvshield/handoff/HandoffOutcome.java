package dev.kvshield.handoff;

/** Where a decode-side reservation ended. */
public enum HandoffOutcome {
    /** Reserved, transfer in flight, not yet committed or refused. */
    PENDING,
    /** Coverage spans the sequence and every reserved page was written by this transfer: the request may decode. */
    COMMITTED,
    /** The sender published fewer tokens than the request's sequence: the request fails with an abort. */
    REFUSED_COVERAGE,
    /** A reserved page was not (fully) written by this transfer in its current generation: the request fails. */
    REFUSED_UNWRITTEN,
    /** The decode side aborted the request (cancelled) before commit. */
    ABORTED,
    /** The transfer never acknowledged: its claims were fenced and its pages stay quarantined until drained. */
    EXPIRED;

    /** True for outcomes where the client must see an abort (4xx/5xx, abort finish reason), never a success. */
    public boolean failsRequest() {
        return this != PENDING && this != COMMITTED;
    }
}
