package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.lease.LeaseException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import org.junit.jupiter.api.Test;

/**
 * A page's buffers read and written in one call: the same guards as one buffer at a time (lease,
 * generation, written extent), checked whole before any byte moves.
 */
class AllBuffersAccessTest {
    static final byte UNTOUCHED = 0x5A;

    /** One segment per buffer of the pool, {@code tokens} slots each, filled with {@link #UNTOUCHED}. */
    private static MemorySegment[] perBuffer(Arena arena, KvPagePool pool, int tokens) {
        MemorySegment[] s = new MemorySegment[pool.geometry().bufferCount()];
        for (int b = 0; b < s.length; b++) {
            s[b] = arena.allocate((long) tokens * pool.geometry().bytesPerToken(b)).fill(UNTOUCHED);
        }
        return s;
    }

    /** True if every byte of every segment is still {@link #UNTOUCHED}. */
    static boolean untouched(MemorySegment... segments) {
        for (MemorySegment s : segments) {
            for (long i = 0; i < s.byteSize(); i++) {
                if (s.get(ValueLayout.JAVA_BYTE, i) != UNTOUCHED) {
                    return false;
                }
            }
        }
        return true;
    }

    @Test
    void eachBufferGetsItsOwnBytesBackAsOneBufferAtATimeReadsThem() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            int buffers = pool.geometry().bufferCount();
            MemorySegment[] src = new MemorySegment[buffers];
            for (int b = 0; b < buffers; b++) {
                src[b] = Patterns.fill(arena, 3L * pool.geometry().bytesPerToken(b), a, 1, 0, b);
            }
            pool.writeAllBuffers(a, Owners.request(1), h[0], 1, src);
            assertTrue(pool.view().isWritten(h[0], 1, 4));
            assertFalse(pool.view().isWritten(h[0], 0, 1));
            MemorySegment[] all = perBuffer(arena, pool, 3);
            pool.readAllBuffers(a, Owners.request(1), h[0], 1, all);
            for (int b = 0; b < buffers; b++) {
                assertTrue(Patterns.matches(all[b], a, 1, 0, b), "buffer " + b + " holds its own bytes");
                MemorySegment one = arena.allocate(all[b].byteSize());
                pool.read(a, Owners.request(1), h[0], b, 1, one);
                assertArrayEquals(one.toArray(ValueLayout.JAVA_BYTE), all[b].toArray(ValueLayout.JAVA_BYTE));
            }
        }
    }

    @Test
    void aBadBatchMovesNoByteAndRecordsNothing() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.NONE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int other = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            MemorySegment[] ragged = perBuffer(arena, pool, 2);
            ragged[ragged.length - 1] = arena.allocate(pool.geometry().bytesPerToken(ragged.length - 1)).fill(UNTOUCHED);
            InvalidGeometryException e = assertThrows(InvalidGeometryException.class,
                    () -> pool.writeAllBuffers(a, Owners.request(1), h[0], 0, ragged));
            assertEquals("a transfer of every buffer covers the same slots in each: buffer 0 has 2 tokens, buffer "
                    + (ragged.length - 1) + " has 1", e.getMessage());
            MemorySegment[] tooFew = new MemorySegment[] {ragged[0]};
            assertThrows(InvalidGeometryException.class, () -> pool.writeAllBuffers(a, Owners.request(1), h[0], 0, tooFew));
            assertThrows(LeaseException.class, () -> pool.writeAllBuffers(other, Owners.request(2), h[0], 0, perBuffer(arena, pool, 2)),
                    "another tenant's request writes nothing through this lease");
            assertFalse(pool.view().isWritten(h[0], 0, 1), "no slot recorded as written");
            MemorySegment[] raw = perBuffer(arena, pool, 4);
            for (int b = 0; b < raw.length; b++) {
                t.memory.read(pool.view().pageOf(h[0]), b, 0, raw[b]);
                assertTrue(Patterns.allZero(raw[b]), "buffer " + b + " was not written");
            }

            MemorySegment[] dst = perBuffer(arena, pool, 2);
            ReadBeforeWriteException rbw = assertThrows(ReadBeforeWriteException.class,
                    () -> pool.readAllBuffers(a, Owners.request(1), h[0], 0, dst));
            assertEquals("read before write: page=1 generation=1 slot=0 was not written in this generation (read of slots [0, 2))",
                    rbw.getMessage());
            assertTrue(untouched(dst), "a refused read copies nothing");

            pool.writeAllBuffers(a, Owners.request(1), h[0], 0, perBuffer(arena, pool, 4));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            MemorySegment[] afterRelease = perBuffer(arena, pool, 4);
            assertThrows(LeaseException.class, () -> pool.readAllBuffers(a, Owners.request(1), h[0], 0, afterRelease));
            assertTrue(untouched(afterRelease), "a released lease reads nothing");
        }
    }
}
