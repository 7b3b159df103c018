package dev.kvshield.cuda.seal;

import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.TenantKeyring;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;

/**
 * Builds a {@link CudaPageSealer} for a pool over GPU page memory ({@code PoolConfig.Builder.sealer}):
 * opens the pool's {@link TenantKeyring} (pool id, rank) from the root key source and a
 * {@link SealLedger} over its pages. Thread-safe.
 */
public final class CudaPageSealerFactory implements PageSealerFactory {
    private final RootKeySource source;

    public CudaPageSealerFactory(RootKeySource source) {
        if (source == null) {
            throw new IllegalArgumentException("a root key source is required");
        }
        this.source = source;
    }

    /**
     * @throws IllegalArgumentException if the pool's memory cannot run the chacha20-xor kernel
     *     (it is not GPU page memory); the message names the memory
     */
    @Override
    public PageSealer create(Context context) {
        if (!(context.memory() instanceof PageKeystreamXor memory)) {
            throw new IllegalArgumentException("pool " + context.poolId() + " rank " + context.rank() + ": the GPU page sealer"
                    + " needs GPU page memory, but " + context.memory().describe() + " is not; use tenant-keys' HostPageSealerFactory");
        }
        TenantKeyring keyring = TenantKeyring.open(source, context.poolId(), context.rank(), context.tenants());
        try {
            return new CudaPageSealer(new SealLedger(keyring, context.geometry().pageCount()), memory);
        } catch (RuntimeException e) {
            keyring.close();
            throw e;
        }
    }
}
