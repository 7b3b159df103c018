package dev.kvshield.claims;

/**
 * Codec of claim ids:
 *
 * <pre>
 *  63 62                             32 31                              0
 * +--+--------------------------------+--------------------------------+
 * | 0|  slot generation (31 bits, >=1)|        claim slot (32 bits)    |
 * +--+--------------------------------+--------------------------------+
 * </pre>
 *
 * Claim slots are reused; the slot generation makes an id of a dropped claim stale.
 */
public final class ClaimIds {
    public static final long NONE = 0L;

    private ClaimIds() {}

    public static long encode(int slot, int generation) {
        return ((long) generation << 32) | (slot & 0xFFFF_FFFFL);
    }

    public static int slot(long claimId) {
        return (int) claimId;
    }

    public static int generation(long claimId) {
        return (int) (claimId >>> 32);
    }

    public static boolean isWellFormed(long claimId) {
        return claimId > 0 && generation(claimId) >= 1 && slot(claimId) >= 0;
    }
}
