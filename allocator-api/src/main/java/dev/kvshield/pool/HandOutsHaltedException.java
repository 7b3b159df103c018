package dev.kvshield.pool;

import dev.kvshield.KvShieldException;

/** The pool stopped handing out pages (e.g. COMPLIANCE without a writable audit); the message says why. */
public final class HandOutsHaltedException extends KvShieldException {
    public HandOutsHaltedException(String message) {
        super(message);
    }
}
