package dev.kvshield.metrics;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import org.junit.jupiter.api.Test;

/** The documented meters exist with their tags and count what happened. */
class PoolMetricsTest {
    @Test
    void metersCountPagesBytesAndRejections() {
        PoolGeometry g = PoolGeometry.builder().mha(2, 1, 4, 2).pageSizeTokens(4).pageCount(5).build();
        SimpleMeterRegistry r = new SimpleMeterRegistry();
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO).poolId("p").rank(3)
                        .meterRegistry(r).build(), memory)) {
            int a = pool.tenants().register("a");
            long[] h = new long[3];
            pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 3, h, 0);
            pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            long[] again = new long[1];
            pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, again, 0);
            assertThrows(ReleasedLeaseException.class, () -> pool.markWritten(a, Owners.request(1), h[0], 0, 1));
            assertEquals(4.0, r.get(MetricNames.PAGES_ALLOCATED).tag("pool", "p").tag("rank", "3").counter().count());
            assertEquals(2.0, r.get(MetricNames.PAGES_RELEASED).counter().count());
            assertEquals(2.0, r.get(MetricNames.PAGES_PROTECTED).tag("level", "zero").counter().count());
            assertEquals(2.0 * g.pageBytesAllBuffers(), r.get(MetricNames.BYTES_PROTECTED).tag("level", "zero").counter().count());
            assertEquals(1.0, r.get(MetricNames.REJECTIONS).tag("reason", "double_free").counter().count(), "a released lease presented again");
            assertEquals(2.0, r.get(MetricNames.PAGES).tag("state", "owned").gauge().value());
            assertEquals(2.0, r.get(MetricNames.PAGES).tag("state", "free").gauge().value());
            assertEquals(0.0, r.get(MetricNames.PAGES).tag("state", "retired").gauge().value(), "reserved page 0 is not counted");
            assertEquals(16.0, r.get(MetricNames.ADMISSION_LIMIT).tag("kind", "effective").gauge().value());
        }
    }
}
