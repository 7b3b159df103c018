package dev.kvshield.admission;

import dev.kvshield.KvShieldException;

/** A request longer than the pool's effective limit; thrown before any page is reserved. */
public final class RequestTooLongException extends KvShieldException {
    private final long requestTokens;
    private final long effectiveTokens;

    public RequestTooLongException(long requestTokens, long effectiveTokens, long advertisedTokens) {
        super("request of " + requestTokens + " tokens exceeds the effective limit of " + effectiveTokens + " tokens (advertised "
                + advertisedTokens + ")");
        this.requestTokens = requestTokens;
        this.effectiveTokens = effectiveTokens;
    }

    public long requestTokens() {
        return requestTokens;
    }

    public long effectiveTokens() {
        return effectiveTokens;
    }
}
