package dev.kvshield.claims;

import dev.kvshield.KvShieldException;

/** Every claim slot is in use; the message names the capacity. Raise {@code maxClaims}. */
public final class ClaimCapacityException extends KvShieldException {
    public ClaimCapacityException(String message) {
        super(message);
    }
}
