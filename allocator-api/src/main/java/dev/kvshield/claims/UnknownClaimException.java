package dev.kvshield.claims;

import dev.kvshield.KvShieldException;

/** A claim id that names no live or revoked claim: malformed, already dropped, or of another pool. */
public final class UnknownClaimException extends KvShieldException {
    public UnknownClaimException(String message) {
        super(message);
    }
}
