package dev.kvshield.keys;

import dev.kvshield.KvShieldException;

/**
 * A root key could not be loaded safely (unreadable, wrong size, readable by others); the process
 * must not start sealing. Messages name the source and the problem, never key bytes.
 */
public class KeySourceException extends KvShieldException {
    public KeySourceException(String message) {
        super(message);
    }

    public KeySourceException(String message, Throwable cause) {
        super(message, cause);
    }
}
