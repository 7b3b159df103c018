package dev.kvshield.tenant;

import dev.kvshield.KvShieldException;

/** A tenant id or name the pool has not registered. */
public final class UnknownTenantException extends KvShieldException {
    public UnknownTenantException(String message) {
        super(message);
    }
}
