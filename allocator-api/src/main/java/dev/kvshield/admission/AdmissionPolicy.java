package dev.kvshield.admission;

import java.math.BigDecimal;
import java.math.RoundingMode;

/**
 * What the operator asks of admission.
 *
 * <p>The headroom is a decimal, not a {@code double}: what a pool holds is a whole number of tokens
 * taken from {@code capacity x (1 - headroom)}, and binary floating point puts that product just
 * under an exact whole number often enough (90 slots at 0.3 is 62.99999999999999 in doubles) to
 * lose a token the operator sized the pool for.
 *
 * @param advertisedMaxContextTokens the context length the engine advertises to clients
 * @param headroomFraction share of the pool, in {@code [0, 1)}, that must stay free for other
 *     requests while one max-length request is resident
 * @param strict refuse to build a pool that cannot hold one advertised max-length request, instead
 *     of lowering the limit loudly
 */
public record AdmissionPolicy(long advertisedMaxContextTokens, BigDecimal headroomFraction, boolean strict) {
    /** Most decimal places a headroom may have (it is a share of a pool, and the arithmetic on it stays small). */
    public static final int MAX_HEADROOM_DECIMALS = 30;

    public AdmissionPolicy {
        if (advertisedMaxContextTokens <= 0) {
            throw new IllegalArgumentException("advertisedMaxContextTokens must be positive: " + advertisedMaxContextTokens);
        }
        if (headroomFraction == null || headroomFraction.signum() < 0 || headroomFraction.compareTo(BigDecimal.ONE) >= 0) {
            throw new IllegalArgumentException("headroomFraction must be in [0, 1): "
                    + (headroomFraction == null ? "null" : headroomFraction.toString()));
        }
        if (headroomFraction.stripTrailingZeros().scale() > MAX_HEADROOM_DECIMALS) {
            throw new IllegalArgumentException("headroomFraction must have at most " + MAX_HEADROOM_DECIMALS + " decimal places: "
                    + headroomFraction);
        }
    }

    /**
     * A policy whose headroom is the decimal {@code headroomFraction} prints as ({@link
     * Double#toString}): the literal a caller wrote, for any literal of up to 15 significant digits.
     *
     * @throws IllegalArgumentException for NaN, infinities, or a value outside {@code [0, 1)}
     */
    public AdmissionPolicy(long advertisedMaxContextTokens, double headroomFraction, boolean strict) {
        this(advertisedMaxContextTokens, decimal(headroomFraction), strict);
    }

    private static BigDecimal decimal(double headroomFraction) {
        if (!Double.isFinite(headroomFraction)) {
            throw new IllegalArgumentException("headroomFraction must be in [0, 1): " + headroomFraction);
        }
        return BigDecimal.valueOf(headroomFraction);
    }

    /**
     * No advertised limit beyond the pool itself: the effective (and advertised) limit is what the
     * pool holds.
     */
    public static AdmissionPolicy poolBound() {
        return new AdmissionPolicy(Long.MAX_VALUE, BigDecimal.ZERO, false);
    }

    /**
     * The longest request a pool of {@code capacityTokens} token slots holds with the headroom kept
     * free: {@code floor(capacityTokens x (1 - headroom))}, computed exactly.
     */
    public long holdsTokens(long capacityTokens) {
        if (capacityTokens < 0) {
            throw new IllegalArgumentException("capacityTokens must be >= 0: " + capacityTokens);
        }
        return BigDecimal.valueOf(capacityTokens).multiply(BigDecimal.ONE.subtract(headroomFraction))
                .setScale(0, RoundingMode.FLOOR).longValueExact();
    }

    /**
     * The fewest token slots a pool needs for {@link #holdsTokens} to reach {@code tokens}:
     * {@code ceil(tokens / (1 - headroom))}, computed exactly; {@link Long#MAX_VALUE} when no
     * {@code long} count of slots is enough.
     */
    public long slotsToHold(long tokens) {
        if (tokens < 0) {
            throw new IllegalArgumentException("tokens must be >= 0: " + tokens);
        }
        BigDecimal slots = BigDecimal.valueOf(tokens).divide(BigDecimal.ONE.subtract(headroomFraction), 0, RoundingMode.CEILING);
        return slots.compareTo(BigDecimal.valueOf(Long.MAX_VALUE)) > 0 ? Long.MAX_VALUE : slots.longValueExact();
    }
}
