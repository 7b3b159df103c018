package dev.kvshield.tenant;

import dev.kvshield.KvShieldException;

/** A caller that is not the page's owner (or a reader of its tenant) touched the page. */
public final class ForeignAccessException extends KvShieldException {
    public ForeignAccessException(String message) {
        super(message);
    }
}
