package dev.kvshield.lease;

import dev.kvshield.KvShieldException;

/** A lease presented where it does not hold: the message names the lease, its page and the values that disagree. */
public abstract class LeaseException extends KvShieldException {
    private final long lease;

    protected LeaseException(long lease, String message) {
        super(message);
        this.lease = lease;
    }

    /** The lease id as presented. */
    public long lease() {
        return lease;
    }
}
