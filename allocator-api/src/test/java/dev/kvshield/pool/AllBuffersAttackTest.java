package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.lease.LeaseKind;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import org.junit.jupiter.api.Test;

/**
 * {@link KvPagePool#writeAllBuffers} and {@link KvPagePool#readAllBuffers} given batches whose flaw
 * only shows when a byte would move: a missing array or segment, a segment already closed, confined
 * to another thread, or (as a destination) read-only — placed last, after buffers that are fine.
 * Each must be refused whole, naming the buffer, before any byte moves: no buffer of the page
 * written, no destination filled (a read whose bytes left with no {@code READ} event would be a
 * hole in the audit trail), no extent marked, no event.
 */
class AllBuffersAttackTest {
    private static final byte UNTOUCHED = AllBuffersAccessTest.UNTOUCHED;
    private static final long OWNER = Owners.request(1);

    /** A pool, tenant {@code a}'s lease {@code h} on one page, and every page event from then on. */
    private record Fixture(TestPools t, int a, long h, List<String> events) implements AutoCloseable {
        static Fixture create() {
            TestPools t = TestPools.create(3, ProtectionLevel.NONE);
            int a = t.pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(t.pool.allocate(a, OWNER, LeaseKind.OWNER, 1, h, 0));
            List<String> events = new ArrayList<>();
            t.pool.addListener((type, page, generation, tenant, owner, detail) -> events.add(type + " page " + page));
            return new Fixture(t, a, h[0], events);
        }

        KvPagePool pool() {
            return t.pool;
        }

        int buffers() {
            return t.pool.geometry().bufferCount();
        }

        long bytes(int buffer, int tokens) {
            return (long) tokens * t.pool.geometry().bytesPerToken(buffer);
        }

        /** Every buffer of the lease's page, slots [0, tokens), as the memory holds them. */
        List<byte[]> raw(Arena arena, int tokens) {
            List<byte[]> out = new ArrayList<>();
            for (int b = 0; b < buffers(); b++) {
                MemorySegment s = arena.allocate(bytes(b, tokens));
                t.memory.read(t.pool.view().pageOf(h), b, 0, s);
                out.add(s.toArray(ValueLayout.JAVA_BYTE));
            }
            return out;
        }

        @Override
        public void close() {
            t.close();
        }
    }

    /** One segment per buffer, {@code tokens} slots each, made by {@code last} for the last buffer. */
    private static MemorySegment[] batch(Fixture f, Arena arena, int tokens, Function<Long, MemorySegment> last) {
        MemorySegment[] s = new MemorySegment[f.buffers()];
        for (int b = 0; b < s.length; b++) {
            long bytes = f.bytes(b, tokens);
            s[b] = b < s.length - 1 ? Patterns.fill(arena, bytes, f.a(), 1, 0, b) : last.apply(bytes);
        }
        return s;
    }

    private static MemorySegment closedSegment(long bytes) {
        Arena gone = Arena.ofConfined();
        MemorySegment s = gone.allocate(bytes);
        gone.close();
        return s;
    }

    /** A segment of an arena confined to another (finished) thread. */
    private static MemorySegment otherThreadsSegment(long bytes) {
        return CompletableFuture.supplyAsync(() -> Arena.ofConfined().allocate(bytes)).join();
    }

    @Test
    void aWriteWhoseLastSourceCannotBeReadWritesNoBufferOfThePage() {
        record Case(String name, Class<? extends RuntimeException> thrown, Function<Long, MemorySegment> last) {}
        List<Case> cases = List.of(
                new Case("closed", IllegalStateException.class, AllBuffersAttackTest::closedSegment),
                new Case("confined to another thread", WrongThreadException.class, AllBuffersAttackTest::otherThreadsSegment),
                new Case("null", IllegalArgumentException.class, bytes -> null));
        for (Case c : cases) {
            try (Fixture f = Fixture.create(); Arena arena = Arena.ofConfined()) {
                List<byte[]> before = f.raw(arena, 4);
                MemorySegment[] src = batch(f, arena, 4, c.last());
                RuntimeException e = assertThrows(c.thrown(), () -> f.pool().writeAllBuffers(f.a(), OWNER, f.h(), 0, src), c.name());
                List<byte[]> after = f.raw(arena, 4);
                for (int b = 0; b < f.buffers(); b++) {
                    assertTrue(java.util.Arrays.equals(before.get(b), after.get(b)), c.name() + ": buffer " + b + " of the page was written");
                }
                assertFalse(f.pool().view().isWritten(f.h(), 0, 1), c.name());
                assertEquals(List.of(), f.events(), c.name());
                assertTrue(e.getMessage() != null && e.getMessage().contains("buffer " + (f.buffers() - 1)),
                        c.name() + ": the message names the buffer: " + e.getMessage());
            }
        }
        // Twin: the same batch with a good last source writes every buffer, marks the slots, one WRITE event.
        try (Fixture f = Fixture.create(); Arena arena = Arena.ofConfined()) {
            f.pool().writeAllBuffers(f.a(), OWNER, f.h(), 0, batch(f, arena, 4, bytes -> Patterns.fill(arena, bytes, f.a(), 1, 0, f.buffers() - 1)));
            MemorySegment last = arena.allocate(f.bytes(f.buffers() - 1, 4));
            f.t().memory.read(f.pool().view().pageOf(f.h()), f.buffers() - 1, 0, last);
            assertTrue(Patterns.matches(last, f.a(), 1, 0, f.buffers() - 1));
            assertTrue(f.pool().view().isWritten(f.h(), 0, 4));
            assertEquals(List.of("WRITE page " + f.pool().view().pageOf(f.h())), f.events());
        }
    }

    @Test
    void aReadWhoseLastDestinationCannotBeWrittenFillsNoDestinationAndRecordsNoRead() {
        record Case(String name, Class<? extends RuntimeException> thrown, Function<Long, MemorySegment> last) {}
        try (Arena shared = Arena.ofConfined()) {
            List<Case> cases = List.of(
                    new Case("read-only", IllegalArgumentException.class, bytes -> shared.allocate(bytes).fill(UNTOUCHED).asReadOnly()),
                    new Case("closed", IllegalStateException.class, AllBuffersAttackTest::closedSegment),
                    new Case("confined to another thread", WrongThreadException.class, AllBuffersAttackTest::otherThreadsSegment),
                    new Case("null", IllegalArgumentException.class, bytes -> null));
            for (Case c : cases) {
                try (Fixture f = Fixture.create(); Arena arena = Arena.ofConfined()) {
                    f.pool().writeAllBuffers(f.a(), OWNER, f.h(), 0,
                            batch(f, arena, 4, bytes -> Patterns.fill(arena, bytes, f.a(), 1, 0, f.buffers() - 1)));
                    f.events().clear();
                    MemorySegment[] dst = batch(f, arena, 4, c.last());
                    for (int b = 0; b < dst.length - 1; b++) {
                        dst[b].fill(UNTOUCHED);
                    }
                    RuntimeException e = assertThrows(c.thrown(), () -> f.pool().readAllBuffers(f.a(), OWNER, f.h(), 0, dst), c.name());
                    for (int b = 0; b < dst.length - 1; b++) {
                        assertTrue(AllBuffersAccessTest.untouched(dst[b]), c.name() + ": buffer " + b + "'s bytes left the pool");
                    }
                    assertEquals(List.of(), f.events(), c.name() + ": no READ without the read");
                    assertTrue(e.getMessage() != null && e.getMessage().contains("buffer " + (f.buffers() - 1)),
                            c.name() + ": the message names the buffer: " + e.getMessage());
                }
            }
        }
        // Twin: a good destination gets every buffer's bytes and one READ event.
        try (Fixture f = Fixture.create(); Arena arena = Arena.ofConfined()) {
            f.pool().writeAllBuffers(f.a(), OWNER, f.h(), 0, batch(f, arena, 4, bytes -> Patterns.fill(arena, bytes, f.a(), 1, 0, f.buffers() - 1)));
            f.events().clear();
            MemorySegment[] dst = batch(f, arena, 4, bytes -> arena.allocate(bytes).fill(UNTOUCHED));
            for (MemorySegment d : dst) {
                d.fill(UNTOUCHED);
            }
            f.pool().readAllBuffers(f.a(), OWNER, f.h(), 0, dst);
            for (int b = 0; b < dst.length; b++) {
                assertTrue(Patterns.matches(dst[b], f.a(), 1, 0, b), "buffer " + b);
            }
            assertEquals(List.of("READ page " + f.pool().view().pageOf(f.h())), f.events());
        }
    }

    @Test
    void aMissingBatchArrayIsRefusedByName() {
        try (Fixture f = Fixture.create()) {
            IllegalArgumentException w = assertThrows(IllegalArgumentException.class, () -> f.pool().writeAllBuffers(f.a(), OWNER, f.h(), 0, null));
            assertEquals("a transfer of every buffer needs " + f.buffers() + " segments, one per buffer, got none (null)", w.getMessage());
            IllegalArgumentException r = assertThrows(IllegalArgumentException.class, () -> f.pool().readAllBuffers(f.a(), OWNER, f.h(), 0, null));
            assertEquals(w.getMessage(), r.getMessage());
            assertEquals(List.of(), f.events());
        }
    }
}
