package dev.kvshield.memory;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.testing.Patterns;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * The conformance suite every {@link PageMemory} backend passes (shipped in the test-jar):
 * subclasses say how to make a backend for a geometry. Every check reads bytes back.
 */
public abstract class PageMemoryConformanceTest {

    /** A fresh, zero-filled backend for {@code geometry}. */
    protected abstract PageMemory create(PoolGeometry geometry);

    public static List<PoolGeometry> geometries() {
        return List.of(
                PoolGeometry.builder().mha(2, 2, 8, 2).pageSizeTokens(4).pageCount(9).build(),
                PoolGeometry.builder().mla(3, 24, 1).pageSizeTokens(1).pageCount(17).build(),
                PoolGeometry.builder().mha(1, 1, 3, 2).pageSizeTokens(16).pageCount(5).build(),
                PoolGeometry.builder().mha(4, 1, 64, 2).pageSizeTokens(64).pageCount(6).pageZeroReserved(false).build(),
                explicitSglangLike());
    }

    /**
     * An explicit buffer list shaped like SGLang pools sharing one allocator: target K/V with FP4
     * scale buffers, a DSA indexer buffer, a shared dequant workspace, and a draft layer of another
     * shape; page sizes not multiples of 16 and 2-byte scale pages among them.
     */
    public static PoolGeometry explicitSglangLike() {
        return PoolGeometry.builder().pageSizeTokens(3).pageCount(7)
                .buffer(BufferKind.K, "target.k_buffer[0]", 32).buffer(BufferKind.V, "target.v_buffer[0]", 32)
                .buffer(BufferKind.SCALE, "target.k_scale_buffer[0]", 2).buffer(BufferKind.SCALE, "target.v_scale_buffer[0]", 2)
                .buffer(BufferKind.INDEX, "target.index_key_cache.buffer[0]", 132)
                .buffer(BufferKind.WORKSPACE, "target.dq_k_buffer", 64)
                .buffer(BufferKind.K, "draft.k_buffer[0]", 24).buffer(BufferKind.V, "draft.v_buffer[0]", 8).build();
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void writeThenReadReturnsTheSameBytesInEveryBufferAndSlot(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            for (int b = 0; b < g.bufferCount(); b++) {
                int bpt = g.bytesPerToken(b);
                for (int slot = 0; slot < g.pageSizeTokens(); slot += Math.max(1, g.pageSizeTokens() / 3)) {
                    int page = (b + slot) % g.pageCount();
                    MemorySegment src = Patterns.fill(arena, bpt, 1, slot, page, b);
                    m.write(page, b, slot, src);
                    MemorySegment dst = arena.allocate(bpt);
                    m.read(page, b, slot, dst);
                    assertTrue(Patterns.matches(dst, 1, slot, page, b), "page " + page + " buffer " + b + " slot " + slot);
                }
            }
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void scrubZeroesExactlyTheListedPagesAcrossAllBuffers(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            fillAll(m, g, arena);
            int[] pages = {g.pageCount() - 1, 1, 0};
            m.scrub(pages, 1, 2); // scrubs pages 1 and 0 only
            assertOnlyPagesZeroAre0And1(m, g, arena);
        }
    }

    /** Pages 0 and 1 are zero in every buffer; every other page still holds what {@link #fillAll} wrote. */
    private static void assertOnlyPagesZeroAre0And1(PageMemory m, PoolGeometry g, Arena arena) {
        for (int p = 0; p < g.pageCount(); p++) {
            for (int b = 0; b < g.bufferCount(); b++) {
                MemorySegment page = readPage(m, g, arena, p, b);
                if (p == 0 || p == 1) {
                    assertTrue(Patterns.allZero(page), "scrubbed page " + p + " buffer " + b + " not zero");
                } else {
                    assertTrue(Patterns.matches(page, 7, 0, p, b), "page " + p + " buffer " + b + " was touched");
                }
            }
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void scrubAndVerifyZeroesExactlyTheListedPagesAndFindsThemClean(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            fillAll(m, g, arena);
            int[] pages = {g.pageCount() - 1, 1, 0};
            int[] dirty = {-1, -1};
            assertEquals(0, m.scrubAndVerify(pages, 1, 2, dirty), "pages 1 and 0 verify clean after their scrub");
            assertArrayEquals(new int[] {-1, -1}, dirty, "nothing listed as dirty");
            assertOnlyPagesZeroAre0And1(m, g, arena);
            assertThrows(InvalidGeometryException.class, () -> m.scrubAndVerify(new int[] {2, g.pageCount()}, 0, 2, new int[2]));
            assertThrows(IllegalArgumentException.class, () -> m.scrubAndVerify(new int[] {2, 3}, 0, 2, new int[1]));
            for (int b = 0; b < g.bufferCount(); b++) {
                assertTrue(Patterns.matches(readPage(m, g, arena, 2, b), 7, 0, 2, b), "a refused call zeroed page 2");
            }
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void verifyZeroNamesExactlyTheDirtyPagesInListOrder(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            int[] all = allPages(g);
            int[] dirty = new int[all.length];
            assertEquals(0, m.verifyZero(all, 0, all.length, dirty), "fresh memory must verify clean");
            int last = g.pageCount() - 1;
            int lastBuffer = g.bufferCount() - 1;
            // One non-zero byte in the last token of the last buffer of two pages.
            MemorySegment one = arena.allocate(g.bytesPerToken(lastBuffer));
            one.set(java.lang.foreign.ValueLayout.JAVA_BYTE, one.byteSize() - 1, (byte) 1);
            m.write(last, lastBuffer, g.pageSizeTokens() - 1, one);
            m.write(0, lastBuffer, g.pageSizeTokens() - 1, one);
            int n = m.verifyZero(new int[] {last, 0}, 0, 2, dirty);
            assertEquals(2, n);
            assertArrayEquals(new int[] {last, 0}, java.util.Arrays.copyOf(dirty, 2));
            m.scrub(new int[] {0}, 0, 1);
            n = m.verifyZero(all, 0, all.length, dirty);
            assertEquals(1, n);
            assertEquals(last, dirty[0]);
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void outOfRangeAccessIsRejectedBeforeTouchingMemory(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            fillAll(m, g, arena);
            int bpt = g.bytesPerToken(0);
            MemorySegment token = arena.allocate(bpt);
            assertThrows(InvalidGeometryException.class, () -> m.write(g.pageCount(), 0, 0, token));
            assertThrows(InvalidGeometryException.class, () -> m.write(-1, 0, 0, token));
            assertThrows(InvalidGeometryException.class, () -> m.write(1, g.bufferCount(), 0, token));
            assertThrows(InvalidGeometryException.class, () -> m.write(1, 0, g.pageSizeTokens(), token));
            assertThrows(InvalidGeometryException.class, () -> m.write(1, 0, 0, arena.allocate((long) bpt * (g.pageSizeTokens() + 1))));
            if (bpt > 1) {
                assertThrows(InvalidGeometryException.class, () -> m.write(1, 0, 0, arena.allocate(bpt - 1)));
            }
            assertThrows(InvalidGeometryException.class, () -> m.read(1, 0, g.pageSizeTokens(), token));
            assertThrows(InvalidGeometryException.class, () -> m.scrub(new int[] {1, g.pageCount()}, 0, 2));
            assertThrows(InvalidGeometryException.class, () -> m.verifyZero(new int[] {-5}, 0, 1, new int[1]));
            assertThrows(IllegalArgumentException.class, () -> m.scrub(new int[] {1}, 0, 2));
            for (int p = 0; p < g.pageCount(); p++) {
                for (int b = 0; b < g.bufferCount(); b++) {
                    assertTrue(Patterns.matches(readPage(m, g, arena, p, b), 7, 0, p, b), "rejected call changed page " + p);
                }
            }
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void randomScatteredScrubsMatchAReferenceModel(PoolGeometry g) {
        Random random = new Random(42);
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            boolean[] zero = new boolean[g.pageCount()];
            fillAll(m, g, arena);
            for (int round = 0; round < 20; round++) {
                int n = 1 + random.nextInt(g.pageCount());
                int[] pages = new int[n];
                for (int i = 0; i < n; i++) {
                    pages[i] = random.nextInt(g.pageCount());
                    zero[pages[i]] = true;
                }
                m.scrub(pages, 0, n);
            }
            for (int p = 0; p < g.pageCount(); p++) {
                for (int b = 0; b < g.bufferCount(); b++) {
                    MemorySegment page = readPage(m, g, arena, p, b);
                    assertTrue(zero[p] ? Patterns.allZero(page) : Patterns.matches(page, 7, 0, p, b), "page " + p + " buffer " + b);
                }
            }
        }
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void emptyBatchesAreNoOps(PoolGeometry g) {
        try (PageMemory m = create(g); Arena arena = Arena.ofConfined()) {
            fillAll(m, g, arena);
            m.scrub(new int[0], 0, 0);
            assertEquals(0, m.verifyZero(new int[0], 0, 0, new int[0]));
            assertTrue(Patterns.matches(readPage(m, g, arena, 1, 0), 7, 0, 1, 0));
        }
    }

    protected static int[] allPages(PoolGeometry g) {
        int[] all = new int[g.pageCount()];
        for (int p = 0; p < all.length; p++) {
            all[p] = p;
        }
        return all;
    }

    protected static void fillAll(PageMemory m, PoolGeometry g, Arena arena) {
        for (int p = 0; p < g.pageCount(); p++) {
            for (int b = 0; b < g.bufferCount(); b++) {
                m.write(p, b, 0, Patterns.fill(arena, g.pageBytes(b), 7, 0, p, b));
            }
        }
    }

    protected static MemorySegment readPage(PageMemory m, PoolGeometry g, Arena arena, int page, int buffer) {
        MemorySegment dst = arena.allocate(g.pageBytes(buffer));
        m.read(page, buffer, 0, dst);
        return dst;
    }
}
