package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.UnknownTenantException;
import dev.kvshield.testing.TestPools;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/** {@link KvPagePool#isSharedNamespace} answers what {@link KvPagePool#declareSharedNamespace} declared, per tenant. */
class SharedNamespaceTest {
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
}
