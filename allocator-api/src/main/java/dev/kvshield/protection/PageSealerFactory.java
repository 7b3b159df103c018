package dev.kvshield.protection;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.tenant.TenantRegistry;

/** Builds the {@link PageSealer} of one pool, once the pool's memory and tenants exist. */
@FunctionalInterface
public interface PageSealerFactory {
    PageSealer create(Context context);

    /**
     * What a sealer binds to: the pool's identity (for key derivation), its memory and its
     * tenants (for stable tenant names).
     */
    record Context(String poolId, int rank, PoolGeometry geometry, PageMemory memory, TenantRegistry tenants) {}
}
