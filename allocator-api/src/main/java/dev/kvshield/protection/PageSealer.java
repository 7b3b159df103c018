package dev.kvshield.protection;

/**
 * Seals (encrypts in place) and unseals pages with a tenant's keystream: the SPI behind
 * {@link ProtectionLevel#ENCRYPT}. Implemented by {@code tenant-keys} for host memory and by
 * {@code cuda-scrub} on the GPU; the pool never sees key material.
 *
 * <p>Contract:
 *
 * <ul>
 *   <li>{@code seal} XORs every buffer of each page with a keystream unique to (tenant key, page,
 *       generation, buffer, offset); a (key, page, generation) is sealed at most once: sealing it
 *       again throws rather than reuse a keystream.
 *   <li>{@code unseal} is the inverse, given the epoch that {@code seal} returned.
 *   <li>Both return only when the bytes are transformed (the work is confirmed complete), or throw
 *       {@link ProtectionException} leaving the pages out of circulation.
 *   <li>Safe for concurrent calls that touch disjoint pages (a protection worker seals while the
 *       scheduler thread reclaims).
 *   <li>Reads its {@code pages} and {@code generations} arrays and never writes them: they are the
 *       pool's own scratch, whose order pairs each page with its generation and its caller's slot.
 *   <li>Never calls back into the pool: it runs under the pool lock, inside a call whose checks
 *       are done.
 * </ul>
 */
public interface PageSealer extends AutoCloseable {
    /** True if {@code tenant} has a usable key now (a key source is configured and not shredded). */
    boolean canSeal(int tenant);

    /**
     * Seals {@code pages[offset .. offset+count)}, page {@code i} at {@code generations[i]}, under the
     * tenant's current key epoch.
     *
     * @return the key epoch used, to be passed back to {@link #unseal}
     */
    int seal(int tenant, int[] pages, int[] generations, int offset, int count);

    /** Reverses {@link #seal} for pages sealed under {@code epoch}. */
    void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count);

    /** True while pages sealed by {@code tenant} under {@code epoch} can still be unsealed. */
    boolean isEpochAvailable(int tenant, int epoch);

    /**
     * Crypto-shreds a tenant: destroys every key epoch of the tenant so nothing it sealed can be
     * unsealed again, and later seals for it fail {@link #canSeal}.
     */
    void shred(int tenant);

    @Override
    default void close() {}
}
