package dev.kvshield.keys;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.keys.cipher.PageNonces;
import dev.kvshield.memory.HostPageMemory;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;
import java.lang.foreign.MemorySegment;

/**
 * The CPU {@link PageSealer}: XORs every buffer region of each page in place with the tenant's
 * ChaCha20 keystream, laid out as {@link PageNonces} documents, with the bookkeeping of a
 * {@link SealLedger}. Seal and unseal are the same XOR.
 *
 * <p>Thread-safe for concurrent calls on disjoint pages. Allocates nothing per call.
 *
 * <p>Implementation notes: for {@link HostPageMemory} backends the whole region of each buffer is
 * captured once and pages are addressed by offset, so no slice is created per page; other
 * host-accessible backends go through {@link PageMemory#hostRegion} per page and buffer.
 */
public final class HostPageSealer implements PageSealer {
    private final SealLedger ledger;
    private final PageMemory memory;
    private final PoolGeometry geometry;
    private final MemorySegment[] bufferRegions; // null: use memory.hostRegion
    private final long[] pageBytesByBuffer;
    private final TenantKeyring.PageKeyUse xorPages = this::xorPages;

    /**
     * A sealer over {@code memory} with {@code ledger}'s keys and bookkeeping; the sealer owns and
     * closes the ledger's keyring.
     *
     * @throws IllegalArgumentException if the memory is not host-accessible or its pages are too large
     *     for one nonce
     */
    public HostPageSealer(SealLedger ledger, PageMemory memory) {
        if (!memory.isHostAccessible()) {
            throw new IllegalArgumentException("the CPU page sealer needs host-accessible page memory, but " + memory.describe()
                    + " is not; use the GPU sealer of cuda-scrub for device memory");
        }
        this.geometry = memory.geometry();
        PageNonces.checkGeometry(geometry);
        this.ledger = ledger;
        this.memory = memory;
        int buffers = geometry.bufferCount();
        pageBytesByBuffer = new long[buffers];
        for (int b = 0; b < buffers; b++) {
            pageBytesByBuffer[b] = geometry.pageBytes(b);
        }
        if (memory instanceof HostPageMemory host) {
            bufferRegions = new MemorySegment[buffers];
            for (int b = 0; b < buffers; b++) {
                bufferRegions[b] = host.bufferRegion(b);
            }
        } else {
            bufferRegions = null;
        }
    }

    public SealLedger ledger() {
        return ledger;
    }

    @Override
    public boolean canSeal(int tenant) {
        return ledger.canSeal(tenant);
    }

    @Override
    public int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        int epoch = ledger.beginSeal(tenant, pages, generations, offset, count);
        ledger.keyring().withKey(tenant, epoch, xorPages, pages, generations, offset, count);
        return epoch;
    }

    @Override
    public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        ledger.beginUnseal(tenant, epoch, pages, generations, offset, count);
        ledger.keyring().withKey(tenant, epoch, xorPages, pages, generations, offset, count);
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

    private void xorPages(MemorySegment key, int[] pages, int[] generations, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            int generation = generations[i];
            for (int b = 0; b < pageBytesByBuffer.length; b++) {
                long pageBytes = pageBytesByBuffer[b];
                if (bufferRegions != null) {
                    ChaCha20.xor(key, page, generation, b, 0, bufferRegions[b], page * pageBytes, pageBytes);
                } else {
                    ChaCha20.xor(key, page, generation, b, 0, memory.hostRegion(page, b), 0, pageBytes);
                }
            }
        }
    }
}
