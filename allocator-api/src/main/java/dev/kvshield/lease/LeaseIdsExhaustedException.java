package dev.kvshield.lease;

import dev.kvshield.KvShieldException;

/** The pool's lease counter would pass {@link LeaseIds#MAX_ID}: it mints no more leases, and never wraps. */
public final class LeaseIdsExhaustedException extends KvShieldException {
    public LeaseIdsExhaustedException(String message) {
        super(message);
    }
}
