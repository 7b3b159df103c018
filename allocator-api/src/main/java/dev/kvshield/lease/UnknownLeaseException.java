package dev.kvshield.lease;

/** A lease id this pool never minted (malformed, not yet minted, or of another pool). */
public final class UnknownLeaseException extends LeaseException {
    public UnknownLeaseException(long lease, String message) {
        super(lease, message);
    }
}
