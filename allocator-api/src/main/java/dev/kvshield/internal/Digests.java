package dev.kvshield.internal;

/** A 64-bit mixing function for state digests (not cryptographic: a test and diagnostic aid). */
public final class Digests {
    private Digests() {}

    public static long mix(long h, long v) {
        h ^= v + 0x9E37_79B9_7F4A_7C15L + (h << 6) + (h >>> 2);
        h *= 0xBF58_476D_1CE4_E5B9L;
        return h ^ (h >>> 31);
    }
}
