package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.Test;

/** Reading a slot not written in the page's current generation is an error, not data — even under NONE. */
class WrittenExtentTest {
    @Test
    void readsOfUnwrittenSlotsFailNamingTheSlot() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            int bpt = pool.geometry().bytesPerToken(0);
            pool.write(a, Owners.request(1), h[0], 0, 0, Patterns.fill(arena, 2L * bpt, a, 1, 1, 0));
            MemorySegment two = arena.allocate(2L * bpt);
            pool.read(a, Owners.request(1), h[0], 0, 0, two);
            assertTrue(Patterns.matches(two, a, 1, 1, 0));
            ReadBeforeWriteException e = assertThrows(ReadBeforeWriteException.class,
                    () -> pool.read(a, Owners.request(1), h[0], 0, 1, arena.allocate(2L * bpt)));
            assertEquals("read before write: page=1 generation=1 slot=2 was not written in this generation (read of slots [1, 3))",
                    e.getMessage());
            assertEquals(1.0, pool.metrics().readBeforeWriteCount());
            pool.markWritten(a, Owners.request(1), h[0], 2, 4);
            assertTrue(pool.view().isWritten(h[0], 2, 4));
            assertFalse(pool.view().isWritten(h[0], 0, 4), "slots 0 and 1 were written in buffer 0 only");
            pool.markWritten(a, Owners.request(1), h[0], 0, 2);
            assertTrue(pool.view().isWritten(h[0], 0, 4));
        }
    }

    @Test
    void theExtentDiesWithTheGenerationEvenWhenTheBytesSurvive() {
        try (TestPools t = TestPools.create(2, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            long bytes = pool.geometry().pageBytes(0);
            pool.write(a, Owners.request(1), h[0], 0, 0, Patterns.fill(arena, bytes, a, 1, 1, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            long[] hb = new long[1];
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
            assertFalse(pool.view().isWritten(hb[0], 0, 1));
            // NONE leaves A's bytes in memory, but B cannot read them through the pool: a failed request, not a leak.
            assertThrows(ReadBeforeWriteException.class, () -> pool.read(b, Owners.request(2), hb[0], 0, 0, arena.allocate(bytes)));
        }
    }
}
