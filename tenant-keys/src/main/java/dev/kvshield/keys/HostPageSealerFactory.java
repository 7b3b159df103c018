package dev.kvshield.keys;

import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Builds a {@link HostPageSealer} for each pool that uses it ({@code PoolConfig.Builder.sealer}):
 * opens a {@link TenantKeyring} for the pool's id and rank from the root key source, and a
 * {@link SealLedger} over its pages. Operators reach a pool's keyring (rotation, retirement) through
 * {@link #keyring}.
 *
 * <p>Thread-safe.
 */
public final class HostPageSealerFactory implements PageSealerFactory {
    private final RootKeySource source;
    private final Map<String, TenantKeyring> keyrings = new ConcurrentHashMap<>();

    public HostPageSealerFactory(RootKeySource source) {
        if (source == null) {
            throw new IllegalArgumentException("a root key source is required");
        }
        this.source = source;
    }

    /**
     * @throws IllegalArgumentException if the pool's memory is not host-accessible
     * @throws KeySourceException if the root key cannot be loaded safely
     */
    @Override
    public PageSealer create(Context context) {
        if (!context.memory().isHostAccessible()) {
            throw new IllegalArgumentException("pool " + context.poolId() + " rank " + context.rank() + ": the CPU page sealer needs"
                    + " host-accessible page memory, but " + context.memory().describe() + " is not; use the GPU sealer of cuda-scrub");
        }
        TenantKeyring keyring = TenantKeyring.open(source, context.poolId(), context.rank(), context.tenants());
        try {
            HostPageSealer sealer = new HostPageSealer(new SealLedger(keyring, context.geometry().pageCount()), context.memory());
            keyrings.put(key(context.poolId(), context.rank()), keyring);
            return sealer;
        } catch (RuntimeException e) {
            keyring.close();
            throw e;
        }
    }

    /**
     * The keyring of the latest sealer this factory built for (poolId, rank).
     *
     * @throws IllegalArgumentException if it built none
     */
    public TenantKeyring keyring(String poolId, int rank) {
        TenantKeyring keyring = keyrings.get(key(poolId, rank));
        if (keyring == null) {
            throw new IllegalArgumentException("no sealer was built for pool " + poolId + " rank " + rank + " (built: "
                    + keyrings.keySet() + ")");
        }
        return keyring;
    }

    private static String key(String poolId, int rank) {
        return poolId + "#rank" + rank;
    }
}
