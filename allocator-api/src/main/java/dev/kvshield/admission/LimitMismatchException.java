package dev.kvshield.admission;

import dev.kvshield.KvShieldException;

/** Two pools that hand requests to each other admit different lengths; the handoff is refused. */
public final class LimitMismatchException extends KvShieldException {
    public LimitMismatchException(long localTokens, long peerTokens) {
        super("effective request limits disagree: local " + localTokens + " tokens, peer " + peerTokens + " tokens");
    }
}
