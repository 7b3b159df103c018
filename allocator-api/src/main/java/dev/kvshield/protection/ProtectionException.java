package dev.kvshield.protection;

import dev.kvshield.KvShieldException;

/**
 * Protection work (scrub, seal, verify) failed; the pages it covered stay out of FREE. Messages
 * name pages, tenants and key ids or epochs, never key material.
 */
public class ProtectionException extends KvShieldException {
    public ProtectionException(String message) {
        super(message);
    }

    public ProtectionException(String message, Throwable cause) {
        super(message, cause);
    }
}
