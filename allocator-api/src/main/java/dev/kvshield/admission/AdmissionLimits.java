package dev.kvshield.admission;

import dev.kvshield.geometry.PoolGeometry;
import java.math.BigDecimal;

/**
 * The limits a pool admits requests under, computed once at start.
 *
 * @param advertisedTokens what the engine advertises
 * @param poolHoldsTokens the longest request the pool holds with the headroom kept free
 * @param effectiveTokens {@code min(advertisedTokens, poolHoldsTokens)}: requests longer than this
 *     are rejected before any reservation
 */
public record AdmissionLimits(long advertisedTokens, long poolHoldsTokens, long effectiveTokens) {

    /**
     * Computes the limits of a pool; under a strict policy throws {@link PoolTooSmallException} if
     * the pool cannot hold one advertised max-length request. What the pool holds is {@link
     * AdmissionPolicy#holdsTokens} of its capacity (exact: no token lost to rounding).
     */
    public static AdmissionLimits compute(PoolGeometry geometry, AdmissionPolicy policy) {
        long capacity = geometry.capacityTokens();
        long holds = policy.holdsTokens(capacity);
        // A pool-bound policy advertises nothing: what the pool holds is the advertised limit.
        long advertised = policy.advertisedMaxContextTokens() == Long.MAX_VALUE ? holds : policy.advertisedMaxContextTokens();
        AdmissionLimits limits = new AdmissionLimits(advertised, holds, Math.min(advertised, holds));
        if (limits.isLowered() && policy.strict()) {
            throw new PoolTooSmallException(limits.shortfallMessage(capacity, policy.headroomFraction()) + "; strict admission refuses to start");
        }
        return limits;
    }

    /** True when the pool holds less than the advertised context. */
    public boolean isLowered() {
        return effectiveTokens < advertisedTokens;
    }

    String shortfallMessage(long capacityTokens, BigDecimal headroomFraction) {
        return "the pool cannot hold one max-length request: advertised context " + advertisedTokens + " tokens, pool holds "
                + poolHoldsTokens + " tokens (" + capacityTokens + " token slots with " + headroomFraction.toPlainString()
                + " kept as headroom); admitting only requests up to " + effectiveTokens + " tokens";
    }

    /**
     * Rejects a request longer than the effective limit (or of negative length) before anything is
     * reserved for it.
     */
    public void admit(long requestTokens) {
        if (requestTokens < 0) {
            throw new IllegalArgumentException("request length must be >= 0: requestTokens=" + requestTokens);
        }
        if (requestTokens > effectiveTokens) {
            throw new RequestTooLongException(requestTokens, effectiveTokens, advertisedTokens);
        }
    }

    /** Checks that a peer pool (the other side of a handoff) admits exactly what this one does. */
    public void checkAgrees(long peerEffectiveTokens) {
        if (peerEffectiveTokens != effectiveTokens) {
            throw new LimitMismatchException(effectiveTokens, peerEffectiveTokens);
        }
    }
}
