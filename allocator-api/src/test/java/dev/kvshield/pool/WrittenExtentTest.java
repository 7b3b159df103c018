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
import static org.junit.jupiter.api.Assertions.fail;

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

    /**
     * Promise (DESIGN.md invariant 4, "Written extent": "Per page and generation the pool knows which
     * token slots were written. Reading a slot not written in the current generation is an error
     * (read-before-write), not data"; NONE keeps "every guard"; WrittenExtentTest: "NONE leaves A's
     * bytes in memory, but B cannot read them through the pool: a failed request, not a leak").
     *
     * <p>Was (isolation at NONE): the written extent is one bit per slot for ALL buffers, but
     * KvPagePool.write writes ONE buffer and marks the slot written for every buffer. Tenant B, handed
     * the page tenant A left (NONE: not scrubbed), writes slot 0 of buffer 0 only and then reads slot 0
     * of buffer 1 through its own lease: the guard passes and B gets A's KV bytes. The audit trail's
     * exposure tracker is per slot too, so it records no foreign read either.
     */
    @Test
    void underNoneAOneBufferWriteUnlocksThePreviousTenantsBytesInEveryOtherBuffer() {
        try (TestPools p = TestPools.create(TestPools.tinyGeometry(2), ProtectionLevel.NONE, c -> c, m -> m);
                java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            KvPagePool pool = p.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long ra = Owners.request(1);
            long rb = Owners.request(2);
            int tokenBytes = pool.geometry().bytesPerToken(1);
            long[] la = new long[1];
            assertTrue(pool.allocate(a, ra, LeaseKind.OWNER, 1, la, 0));
            java.lang.foreign.MemorySegment[] secret = new java.lang.foreign.MemorySegment[pool.geometry().bufferCount()];
            for (int buf = 0; buf < secret.length; buf++) {
                secret[buf] = arena.allocate(tokenBytes).fill((byte) 0x5A);
            }
            pool.writeAllBuffers(a, ra, la[0], 0, secret); // A's KV for slot 0, every buffer
            pool.release(a, ra, la, 0, 1, dev.kvshield.audit.ReleaseReason.FINISHED);
            pool.endStep();

            long[] lb = new long[1];
            assertTrue(pool.allocate(b, rb, LeaseKind.OWNER, 1, lb, 0));
            assertEquals(pool.view().pageOf(la[0]), pool.view().pageOf(lb[0]), "precondition: B got A's page");
            pool.write(b, rb, lb[0], 0, 0, arena.allocate(tokenBytes)); // B writes buffer 0, slot 0 only
            java.lang.foreign.MemorySegment got = arena.allocate(tokenBytes);
            try {
                pool.read(b, rb, lb[0], 1, 0, got); // ... and reads buffer 1, slot 0, which it never wrote
            } catch (dev.kvshield.extent.ReadBeforeWriteException expected) {
                return;
            }
            fail("tenant b read buffer 1 of slot 0, never written in its generation; it holds tenant a's bytes: "
                    + java.util.HexFormat.of().formatHex(got.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)));
        }
    }
}
