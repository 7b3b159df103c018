package dev.kvshield.lease;

/** A claim that was fenced (its transfer expired): any use fails; only dropping it on evidence of drain is allowed. */
public final class FencedLeaseException extends LeaseException {
    public FencedLeaseException(long lease, String message) {
        super(lease, message);
    }
}
