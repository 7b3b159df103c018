package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;

/**
 * {@link ProtectionLevel#ENCRYPT}: a released page is sealed in place with its tenant's keystream,
 * so it holds only ciphertext and its tenant may reclaim it for a prefix hit; a tenant the sealer
 * cannot seal for (shredded) is zeroed instead, so no plaintext is ever left behind.
 */
final class SealProtection extends Protection {
    private final PageSealer sealer;
    private final Protection zeroed;

    SealProtection(PageMemory memory, PageSealer sealer) {
        super(memory);
        if (sealer == null) {
            throw new IllegalArgumentException(ProtectionLevel.NO_SEALER_MESSAGE);
        }
        this.sealer = sealer;
        this.zeroed = new ZeroProtection(memory);
    }

    @Override
    public ProtectionLevel level() {
        return ProtectionLevel.ENCRYPT;
    }

    @Override
    public int protect(int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage) {
        return sealer.seal(tenant, pages, generations, 0, count);
    }

    @Override
    public boolean seals() {
        return true;
    }

    @Override
    public Protection forRelease(int tenant) {
        return sealer.canSeal(tenant) ? this : zeroed;
    }
}
