package dev.kvshield.claims;

import dev.kvshield.KvShieldException;

/** A use of a claim that was fenced (expired); the page it covered stays quarantined until drained. */
public final class ClaimRevokedException extends KvShieldException {
    public ClaimRevokedException(String message) {
        super(message);
    }
}
