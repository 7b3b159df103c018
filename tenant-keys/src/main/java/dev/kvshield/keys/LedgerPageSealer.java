package dev.kvshield.keys;

import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.ProtectionException;

/**
 * A {@link PageSealer} whose bookkeeping is a {@link SealLedger}: subclasses supply the XOR of the
 * keystream over the listed pages and a zeroing of them (in host memory, or in a GPU kernel). Seal
 * records the batch in the ledger before any byte changes and returns the epoch used; if the key
 * disappears (shred, retirement) between the two, the pages are zeroed, never left in plaintext.
 * Unseal checks the ledger first.
 *
 * <p>Thread-safe when {@link #xorKeystream} is safe for concurrent calls on disjoint pages.
 */
public abstract class LedgerPageSealer implements PageSealer {
    protected final SealLedger ledger;

    /** A sealer over {@code ledger}; it closes the ledger's keyring when closed. */
    protected LedgerPageSealer(SealLedger ledger) {
        if (ledger == null) {
            throw new IllegalArgumentException("a seal ledger is required");
        }
        this.ledger = ledger;
    }

    public final SealLedger ledger() {
        return ledger;
    }

    /**
     * XORs (tenant, epoch)'s keystream in place over every buffer of {@code pages[offset ..
     * offset+count)}, page {@code i} at {@code generations[i]}, laid out as
     * {@link dev.kvshield.keys.cipher.PageNonces} documents; returns only when the bytes are
     * transformed. The ledger has already accepted the batch.
     */
    protected abstract void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count);

    /** Zeroes every buffer of {@code pages[offset .. offset+count)}; returns only when done. */
    protected abstract void zeroPages(int[] pages, int offset, int count);

    @Override
    public final boolean canSeal(int tenant) {
        return ledger.canSeal(tenant);
    }

    @Override
    public final int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        int epoch = ledger.beginSeal(tenant, pages, generations, offset, count);
        try {
            xorKeystream(tenant, epoch, pages, generations, offset, count);
        } catch (KeyUnavailableException e) {
            // The key was shredded or retired after the ledger accepted the batch, before any byte changed:
            // the pages can never be sealed at this generation, so leave zeros rather than plaintext.
            zeroPages(pages, offset, count);
            throw new ProtectionException("key epoch " + epoch + " of tenant " + tenant + " became unavailable while sealing "
                    + count + " pages; they were zeroed instead and stay out of circulation", e);
        }
        return epoch;
    }

    @Override
    public final void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        ledger.beginUnseal(tenant, epoch, pages, generations, offset, count);
        xorKeystream(tenant, epoch, pages, generations, offset, count);
    }

    @Override
    public final boolean isEpochAvailable(int tenant, int epoch) {
        return ledger.isEpochAvailable(tenant, epoch);
    }

    @Override
    public final void shred(int tenant) {
        ledger.shred(tenant);
    }

    @Override
    public void close() {
        ledger.keyring().close();
    }
}
