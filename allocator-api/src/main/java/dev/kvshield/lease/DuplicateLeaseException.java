package dev.kvshield.lease;

/** One batch lists the same lease, or two leases on the same page, twice. */
public final class DuplicateLeaseException extends LeaseException {
    public DuplicateLeaseException(long lease, String message) {
        super(lease, message);
    }
}
