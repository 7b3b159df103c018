package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.prefix.PrefixCache;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.tenant.UnknownTenantException;
import dev.kvshield.testing.TestPools;
import dev.kvshield.testing.TestXorSealer;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * {@link KvPagePool#isSharedNamespace} answers what {@link KvPagePool#declareSharedNamespace} declared, per tenant; reading a
 * shared namespace is refused up front exactly as its share would refuse it.
 */
class SharedNamespaceTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);

    @Test
    void onlyTheDeclaredTenantIsShared() {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(2), ProtectionLevel.ZERO, UnaryOperator.identity(),
                UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            int shared = pool.tenants().register("public-prompt");
            int other = pool.tenants().register("acme");
            assertFalse(pool.isSharedNamespace(shared));
            pool.declareSharedNamespace(shared);
            assertTrue(pool.isSharedNamespace(shared));
            assertFalse(pool.isSharedNamespace(other), "declaring one tenant shares no other");
            assertThrows(UnknownTenantException.class, () -> pool.isSharedNamespace(other + 7));
        }
    }

    @Test
    void checkShareRefusesAReaderWhoseLevelNeedsAnAuditTrailNoneRecords() {
        PoolGeometry g = TestPools.tinyGeometry(4);
        try (PageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO).build(), memory)) {
            int n = pool.tenants().register("shared");
            int b = pool.tenants().register("b", TenantPolicy.withLevel(ProtectionLevel.COMPLIANCE));
            long[] owner = new long[1];
            assertTrue(pool.allocate(n, R1, LeaseKind.OWNER, 1, owner, 0));
            pool.declareSharedNamespace(n);
            assertThrows(HandOutsHaltedException.class,
                    () -> pool.share(n, R1, owner, 0, 1, LeaseKind.READER, b, R2, new long[1], 0));
            assertThrows(HandOutsHaltedException.class,
                    () -> pool.checkShare(n, R1, owner, 0, 1, LeaseKind.READER, b, R2), "checkShare checks exactly as share would");
        }
    }

    @Test
    void aPrefixMatchTheShareWouldRefuseIsRefusedBeforeItReclaims() {
        PoolGeometry g = TestPools.tinyGeometry(4);
        try (PageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ENCRYPT)
                        .sealer(ctx -> new TestXorSealer(ctx.memory())).build(), memory)) {
            int n = pool.tenants().register("shared");
            int b = pool.tenants().register("b", TenantPolicy.withLevel(ProtectionLevel.COMPLIANCE)); // not regulated
            long[] owner = new long[1];
            assertTrue(pool.allocate(n, R1, LeaseKind.OWNER, 1, owner, 0));
            pool.declareSharedNamespace(n);
            // A sealed shared block: the match would reclaim it (a change) before its share refuses the reader.
            PrefixCache cache = new PrefixCache(pool);
            cache.declareShared(n);
            int[] tokens = {11, 12, 13, 14};
            pool.markWritten(n, R1, owner[0], 0, 4);
            assertEquals(1, cache.insert(n, 1, tokens, owner));
            assertEquals(1, cache.evict(1));
            pool.endStep();
            long before = pool.stateDigest();
            assertThrows(HandOutsHaltedException.class, () -> cache.match(b, 2, tokens, new long[1]));
            assertEquals(before, pool.stateDigest(), "a match that throws leaves the pool as it was");
        }
    }
}
