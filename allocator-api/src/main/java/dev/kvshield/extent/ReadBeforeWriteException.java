package dev.kvshield.extent;

import dev.kvshield.KvShieldException;

/** A read of token slots not written in the page's current generation. */
public final class ReadBeforeWriteException extends KvShieldException {
    public ReadBeforeWriteException(String message) {
        super(message);
    }
}
