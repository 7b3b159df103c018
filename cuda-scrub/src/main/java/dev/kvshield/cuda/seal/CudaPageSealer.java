package dev.kvshield.cuda.seal;

import dev.kvshield.cuda.kernel.KeySlots;
import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.keys.LedgerPageSealer;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.cipher.PageNonces;

/**
 * The GPU {@link dev.kvshield.protection.PageSealer}: tenant-keys' ledger-first seal and unseal
 * ({@link LedgerPageSealer}: sealed at most once per generation, epoch availability, shredding,
 * zeroing when a key vanishes mid-seal) over one chacha20-xor launch per batch. The batch's key
 * reaches the kernel by value for that launch only: copied from the keyring into the launch's key
 * slot just before the launch and wiped right after it. Produces the same bytes as tenant-keys' CPU
 * sealer for the same keyring.
 *
 * <p>Thread-safe: launches serialise (the device runs one launch per call anyway). Allocates
 * nothing per call once a batch of the largest size has been seen.
 */
public final class CudaPageSealer extends LedgerPageSealer {
    private final PageKeystreamXor memory;
    private final PageKeystreamXor.KeyLoader loadKey = this::loadKey;
    private byte[] slotZero = new byte[0]; // guarded by this: every page of a batch uses key slot 0
    private int launchTenant; // guarded by this
    private int launchEpoch; // guarded by this

    /**
     * A sealer over {@code memory} with {@code ledger}'s keys and bookkeeping; the sealer owns and
     * closes the ledger's keyring.
     *
     * @throws IllegalArgumentException if a page region is too large for one nonce
     */
    public CudaPageSealer(SealLedger ledger, PageKeystreamXor memory) {
        super(ledger);
        PageNonces.checkGeometry(memory.geometry());
        this.memory = memory;
    }

    @Override
    protected synchronized void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        if (slotZero.length < offset + count) {
            slotZero = new byte[offset + count];
        }
        launchTenant = tenant;
        launchEpoch = epoch;
        memory.chacha20Xor(pages, generations, slotZero, offset, count, 1, loadKey);
    }

    @Override
    protected void zeroPages(int[] pages, int offset, int count) {
        memory.scrub(pages, offset, count);
    }

    /** Runs under the backend's launch lock, inside {@link #xorKeystream} (so under this sealer's lock too). */
    private void loadKey(KeySlots slots) {
        ledger.keyring().copyKeyForKernelLaunchDangerously(launchTenant, launchEpoch, slots.slot(0));
    }
}
