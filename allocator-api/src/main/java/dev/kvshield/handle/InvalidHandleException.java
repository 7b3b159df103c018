package dev.kvshield.handle;

import dev.kvshield.KvShieldException;

/** A value that is not a handle of this pool: malformed, or naming a page the pool does not have. */
public class InvalidHandleException extends KvShieldException {
    public InvalidHandleException(String message) {
        super(message);
    }
}
