package dev.kvshield.lease;

/** A live claim whose page moved to another generation since it was taken: the page's content is no longer the claimed owner's. */
public final class StaleLeaseException extends LeaseException {
    public StaleLeaseException(long lease, String message) {
        super(lease, message);
    }
}
