package dev.kvshield.keys;

import dev.kvshield.protection.ProtectionException;

/**
 * The seal bookkeeping every sealer of one pool shares (the CPU {@link HostPageSealer} and the
 * GPU sealer in {@code cuda-scrub}): which (tenant, epoch, generation) each page is sealed under,
 * and the rule that a page is sealed at most once per generation, so a (key, page, generation)
 * never gets a second keystream use. Key availability and shredding go through its
 * {@link TenantKeyring}.
 *
 * <p>A sealer calls {@link #beginSeal} before transforming any byte and uses the epoch it
 * returns; {@link #beginUnseal} before decrypting. Both validate the whole batch first and throw,
 * changing nothing, if any page breaks the rules. Once {@code beginSeal} returned, the pages count
 * as sealed even if the transformation then fails: a retry with the same generation is refused
 * rather than XOR the same keystream twice, and the pool keeps those pages out of circulation.
 *
 * <p>Thread-safe (its methods are short and synchronized; the transformation runs outside).
 */
public final class SealLedger {
    private final TenantKeyring keyring;
    private final int pageCount;
    private final int[] highestSealedGeneration; // 0: never sealed (generations start at 1)
    private final int[] sealTenant; // -1: not sealed now
    private final int[] sealEpoch;
    private final int[] mark;
    private int markStamp;

    /** A ledger for pages {@code [0, pageCount)} sealed with {@code keyring}'s keys. */
    public SealLedger(TenantKeyring keyring, int pageCount) {
        if (pageCount <= 0) {
            throw new IllegalArgumentException("pageCount must be positive: " + pageCount);
        }
        this.keyring = keyring;
        this.pageCount = pageCount;
        highestSealedGeneration = new int[pageCount];
        sealTenant = new int[pageCount];
        java.util.Arrays.fill(sealTenant, -1);
        sealEpoch = new int[pageCount];
        mark = new int[pageCount];
    }

    public TenantKeyring keyring() {
        return keyring;
    }

    /** True if {@code tenant} can seal now (see {@link TenantKeyring#canSeal}). */
    public boolean canSeal(int tenant) {
        return keyring.canSeal(tenant);
    }

    /** True while pages sealed by {@code tenant} under {@code epoch} can be unsealed. */
    public boolean isEpochAvailable(int tenant, int epoch) {
        return keyring.isEpochAvailable(tenant, epoch);
    }

    /**
     * Records {@code pages[offset .. offset+count)}, page {@code i} at {@code generations[i]}, as
     * sealed by {@code tenant} under its current epoch.
     *
     * @return the epoch whose key the caller must seal with
     * @throws ProtectionException if a page is out of range, listed twice, or was already sealed at
     *     this or a later generation; {@link KeyUnavailableException} if the tenant cannot seal.
     *     Nothing is recorded then.
     */
    public synchronized int beginSeal(int tenant, int[] pages, int[] generations, int offset, int count) {
        checkRange(pages, generations, offset, count);
        int epoch = keyring.currentEpoch(tenant);
        int stamp = nextStamp();
        for (int i = offset; i < offset + count; i++) {
            int page = checkPage(pages[i]);
            int generation = generations[i];
            if (mark[page] == stamp) {
                throw new ProtectionException("page " + page + " is listed twice in one seal of tenant " + tenant);
            }
            mark[page] = stamp;
            if (generation <= highestSealedGeneration[page]) {
                throw new ProtectionException("refusing to seal page " + page + " at generation " + generation + " for tenant "
                        + tenant + ": it was already sealed at generation " + highestSealedGeneration[page]
                        + " (a keystream is used at most once)");
            }
        }
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            highestSealedGeneration[page] = generations[i];
            sealTenant[page] = tenant;
            sealEpoch[page] = epoch;
        }
        return epoch;
    }

    /**
     * Records pages as unsealed (decrypted back to their owner). Every page must be sealed right
     * now by {@code tenant} under {@code epoch} at exactly the listed generation, and the epoch
     * must be available.
     *
     * @throws ProtectionException naming the first page that is not, or
     *     {@link KeyUnavailableException}; nothing is recorded then
     */
    public synchronized void beginUnseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        checkRange(pages, generations, offset, count);
        if (!keyring.isEpochAvailable(tenant, epoch)) {
            throw new KeyUnavailableException("cannot unseal for tenant " + tenant + ": key epoch " + epoch
                    + " is retired, shredded or was never created");
        }
        int stamp = nextStamp();
        for (int i = offset; i < offset + count; i++) {
            int page = checkPage(pages[i]);
            if (mark[page] == stamp) {
                throw new ProtectionException("page " + page + " is listed twice in one unseal of tenant " + tenant);
            }
            mark[page] = stamp;
            if (sealTenant[page] != tenant || sealEpoch[page] != epoch || highestSealedGeneration[page] != generations[i]) {
                throw new ProtectionException("page " + page + " generation " + generations[i] + " is not sealed by tenant " + tenant
                        + " under epoch " + epoch + " (sealed by tenant " + sealTenant[page] + " epoch " + sealEpoch[page]
                        + " at generation " + highestSealedGeneration[page] + ")");
            }
        }
        for (int i = offset; i < offset + count; i++) {
            sealTenant[pages[i]] = -1;
        }
    }

    /**
     * Crypto-shreds {@code tenant} through the keyring; every page it sealed becomes unrecoverable.
     *
     * @return how many of the tenant's sealed pages this ledger knew of (sealed and not unsealed)
     */
    public synchronized int shred(int tenant) {
        keyring.shred(tenant);
        int n = 0;
        for (int p = 0; p < pageCount; p++) {
            if (sealTenant[p] == tenant) {
                n++;
            }
        }
        return n;
    }

    /** The tenant {@code page} is sealed by now, or -1 (diagnostics and tests). */
    public synchronized int sealedBy(int page) {
        return sealTenant[checkPage(page)];
    }

    /** The highest generation {@code page} was ever sealed at, or 0 (diagnostics and tests). */
    public synchronized int highestSealedGeneration(int page) {
        return highestSealedGeneration[checkPage(page)];
    }

    private int checkPage(int page) {
        if (page < 0 || page >= pageCount) {
            throw new ProtectionException("page " + page + " out of range [0, " + pageCount + ")");
        }
        return page;
    }

    private static void checkRange(int[] pages, int[] generations, int offset, int count) {
        if (count < 0 || offset < 0 || offset > pages.length - count || offset > generations.length - count) {
            throw new IllegalArgumentException("range [" + offset + ", " + ((long) offset + count) + ") is outside pages["
                    + pages.length + "] or generations[" + generations.length + "]");
        }
    }

    private int nextStamp() {
        if (++markStamp == Integer.MAX_VALUE) {
            java.util.Arrays.fill(mark, 0);
            markStamp = 1;
        }
        return markStamp;
    }
}
