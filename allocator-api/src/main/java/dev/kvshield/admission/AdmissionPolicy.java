package dev.kvshield.admission;

/**
 * What the operator asks of admission.
 *
 * @param advertisedMaxContextTokens the context length the engine advertises to clients
 * @param headroomFraction share of the pool, in {@code [0, 1)}, that must stay free for other
 *     requests while one max-length request is resident
 * @param strict refuse to build a pool that cannot hold one advertised max-length request, instead
 *     of lowering the limit loudly
 */
public record AdmissionPolicy(long advertisedMaxContextTokens, double headroomFraction, boolean strict) {
    public AdmissionPolicy {
        if (advertisedMaxContextTokens <= 0) {
            throw new IllegalArgumentException("advertisedMaxContextTokens must be positive: " + advertisedMaxContextTokens);
        }
        if (!(headroomFraction >= 0 && headroomFraction < 1)) {
            throw new IllegalArgumentException("headroomFraction must be in [0, 1): " + headroomFraction);
        }
    }

    /**
     * No advertised limit beyond the pool itself: the effective (and advertised) limit is what the
     * pool holds.
     */
    public static AdmissionPolicy poolBound() {
        return new AdmissionPolicy(Long.MAX_VALUE, 0, false);
    }
}
