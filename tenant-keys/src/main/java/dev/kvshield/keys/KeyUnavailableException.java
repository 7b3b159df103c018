package dev.kvshield.keys;

import dev.kvshield.protection.ProtectionException;

/**
 * A tenant key epoch is not available: retired, shredded, never created, or the keyring is closed.
 * Messages name tenant, epoch and key id, never key bytes.
 */
public class KeyUnavailableException extends ProtectionException {
    public KeyUnavailableException(String message) {
        super(message);
    }
}
