package dev.kvshield.admission;

import dev.kvshield.KvShieldException;

/** Strict admission: the pool cannot hold one advertised max-length request. */
public final class PoolTooSmallException extends KvShieldException {
    public PoolTooSmallException(String message) {
        super(message);
    }
}
