package dev.kvshield.lease;

/** A live lease presented by another tenant or holder than the one it was minted to, for another page, or of a kind the call does not take. */
public final class ForeignLeaseException extends LeaseException {
    public ForeignLeaseException(long lease, String message) {
        super(lease, message);
    }
}
