package dev.kvshield.cuda.seal;

import dev.kvshield.cuda.kernel.KeySlots;
import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.cipher.PageNonces;
import dev.kvshield.protection.PageSealer;

/**
 * The GPU {@link PageSealer}: seals and unseals a batch with one chacha20-xor launch, with the
 * bookkeeping of a tenant-keys {@link SealLedger} (sealed at most once per generation, epoch
 * availability, shredding). The batch's key reaches the kernel by value for that launch only:
 * copied from the keyring into the launch's key slot just before the launch and wiped right after.
 * Produces the same bytes as tenant-keys' CPU sealer for the same keyring.
 *
 * <p>Thread-safe: calls serialise (the device runs one launch per call anyway). Allocates nothing
 * per call once a batch of the largest size has been seen.
 */
public final class CudaPageSealer implements PageSealer {
    private final SealLedger ledger;
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
        PageNonces.checkGeometry(memory.geometry());
        this.ledger = ledger;
        this.memory = memory;
    }

    public SealLedger ledger() {
        return ledger;
    }

    @Override
    public boolean canSeal(int tenant) {
        return ledger.canSeal(tenant);
    }

    @Override
    public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        int epoch = ledger.beginSeal(tenant, pages, generations, offset, count);
        xor(tenant, epoch, pages, generations, offset, count);
        return epoch;
    }

    @Override
    public synchronized void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        ledger.beginUnseal(tenant, epoch, pages, generations, offset, count);
        xor(tenant, epoch, pages, generations, offset, count);
    }

    @Override
    public boolean isEpochAvailable(int tenant, int epoch) {
        return ledger.isEpochAvailable(tenant, epoch);
    }

    @Override
    public void shred(int tenant) {
        ledger.shred(tenant);
    }

    @Override
    public void close() {
        ledger.keyring().close();
    }

    private void xor(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        if (slotZero.length < offset + count) {
            slotZero = new byte[offset + count];
        }
        launchTenant = tenant;
        launchEpoch = epoch;
        memory.chacha20Xor(pages, generations, slotZero, offset, count, 1, loadKey);
    }

    /** Runs under the backend's launch lock, inside {@link #xor} (so under this sealer's lock too). */
    private void loadKey(KeySlots slots) {
        ledger.keyring().copyKeyForKernelLaunchDangerously(launchTenant, launchEpoch, slots.slot(0));
    }
}
