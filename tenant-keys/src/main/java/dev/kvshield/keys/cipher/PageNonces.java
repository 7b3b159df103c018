package dev.kvshield.keys.cipher;

import dev.kvshield.geometry.PoolGeometry;

/**
 * The page nonce scheme: which ChaCha20 nonce and block counters seal one page's region of one
 * buffer. The CPU sealer and the CUDA kernel both build exactly this layout.
 *
 * <pre>
 * state word  | value
 * ------------+----------------------------------------------------------------------------
 *   0 .. 3    | "expand 32-byte k"
 *   4 .. 11   | the tenant's data key for (tenant, epoch, pool, rank, boot), little-endian words
 *   12        | block counter = byteOffset / 64, byteOffset counted from the start of the page's
 *             | region in that buffer (PageMemory.hostRegion(page, buffer)); starts at 0
 *   13        | page index (u32)
 *   14        | page generation at seal (u32): the generation the page moved to at release
 *   15        | global buffer index: the geometry's buffer number, 0 .. bufferCount-1 (u32)
 * </pre>
 *
 * <p>Why this is unique: a data key is never shared between pools, ranks, boots, tenants or
 * epochs (they are all bound into its derivation); within one key, page and buffer name a distinct
 * region and the pool never seals a (page, generation) twice (the {@code SealLedger} enforces it),
 * and a region of at most {@link ChaCha20#MAX_BYTES_PER_NONCE} bytes never wraps the counter.
 */
public final class PageNonces {
    private PageNonces() {}

    /**
     * Checks that every buffer's page region of {@code geometry} fits one nonce's counter range
     * ({@code pageBytes <= 2^32 * 64}); every buffer is checked, since buffers may differ in size.
     *
     * @throws IllegalArgumentException naming the buffer and its page size otherwise
     */
    public static void checkGeometry(PoolGeometry geometry) {
        for (int b = 0; b < geometry.bufferCount(); b++) {
            long pageBytes = geometry.pageBytes(b);
            if (pageBytes > ChaCha20.MAX_BYTES_PER_NONCE) {
                throw new IllegalArgumentException(geometry.describeBuffer(b) + " has " + pageBytes + "-byte pages; one ChaCha20 nonce covers at most "
                        + ChaCha20.MAX_BYTES_PER_NONCE + " bytes without wrapping its block counter");
            }
        }
    }
}
