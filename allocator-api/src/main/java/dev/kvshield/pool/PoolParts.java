package dev.kvshield.pool;

import dev.kvshield.audit.PageEvents;
import dev.kvshield.extent.WrittenExtent;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.quarantine.Quarantine;
import dev.kvshield.seal.SealedPages;
import dev.kvshield.tenant.TenantRegistry;

/** The parts of one pool over its one page table, as the pool's package-private parts reach them (guarded by the pool lock). */
record PoolParts(PoolGeometry geometry, PageMemory memory, TenantRegistry tenants, PageTable table, LeaseTable leases,
        WrittenExtent extent, SealedPages sealed, Quarantine quarantine, PageEvents events, PoolMetrics metrics, Guards guards,
        Shortfall shortfall) {}
