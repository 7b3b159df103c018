package dev.kvshield.keys;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.keys.cipher.PageNonces;
import dev.kvshield.memory.HostPageMemory;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;

/**
 * The CPU {@link dev.kvshield.protection.PageSealer}: XORs every buffer region of each page in place with the tenant's
 * ChaCha20 keystream, laid out as {@link PageNonces} documents, with the bookkeeping of a
 * {@link SealLedger} (see {@link LedgerPageSealer}). Seal and unseal are the same XOR.
 *
 * <p>Thread-safe for concurrent calls on disjoint pages. Allocates nothing per call.
 *
 * <p>Implementation notes: for {@link HostPageMemory} backends the whole region of each buffer is
 * captured once and pages are addressed by offset, so no slice is created per page; other
 * host-accessible backends go through {@link PageMemory#hostRegion} per page and buffer.
 */
public final class HostPageSealer extends LedgerPageSealer {
    private final PageMemory memory;
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
        super(ledger);
        PoolGeometry geometry = memory.geometry();
        PageNonces.checkGeometry(geometry);
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

    @Override
    protected void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        ledger.keyring().withKey(tenant, epoch, xorPages, pages, generations, offset, count);
    }

    @Override
    protected void zeroPages(int[] pages, int offset, int count) {
        memory.scrub(pages, offset, count);
    }

    private void xorPages(MemorySegment key, int[] pages, int[] generations, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            int generation = generations[i];
            for (int b = 0; b < pageBytesByBuffer.length; b++) {
                long pageBytes = pageBytesByBuffer[b];
                // The PageNonces layout: nonce words (page, generation, buffer), counter 0 at the region's first byte.
                if (bufferRegions != null) {
                    ChaCha20.xor(key, page, generation, b, 0, bufferRegions[b], page * pageBytes, pageBytes);
                } else {
                    ChaCha20.xor(key, page, generation, b, 0, memory.hostRegion(page, b), 0, pageBytes);
                }
            }
        }
    }
}
