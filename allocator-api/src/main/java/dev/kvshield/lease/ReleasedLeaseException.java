package dev.kvshield.lease;

/** A lease that was live once and is no longer: presented twice (a double free), or after its hold ended. */
public final class ReleasedLeaseException extends LeaseException {
    public ReleasedLeaseException(long lease, String message) {
        super(lease, message);
    }
}
