package dev.kvshield.geometry;

import dev.kvshield.KvShieldException;

/** A pool geometry, or memory handed over for one, does not fit; the message names the values. */
public final class InvalidGeometryException extends KvShieldException {
    public InvalidGeometryException(String message) {
        super(message);
    }
}
