package dev.kvshield.memory;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.external.ExternalPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The external backend over engine-owned memory given by raw address and length. */
class ExternalConformanceTest extends PageMemoryConformanceTest {
    private final List<Arena> engineArenas = new ArrayList<>();

    @Override
    protected PageMemory create(PoolGeometry g) {
        Arena engine = Arena.ofShared();
        engineArenas.add(engine);
        long[] addresses = new long[g.bufferCount()];
        long[] sizes = new long[g.bufferCount()];
        for (int b = 0; b < g.bufferCount(); b++) {
            MemorySegment s = engine.allocate(g.bufferBytes(b), 16);
            addresses[b] = s.address();
            sizes[b] = s.byteSize();
        }
        return ExternalPageMemory.wrap(g, addresses, sizes);
    }

    @AfterEach
    void freeEngineMemory() {
        engineArenas.forEach(Arena::close);
        engineArenas.clear();
    }

    @Test
    void regionsThatDoNotFitTheGeometryAreRefusedNamingBothSizes() {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(4).pageCount(4).build();
        try (Arena engine = Arena.ofConfined()) {
            MemorySegment small = engine.allocate(g.bufferBytes(0) - 1);
            MemorySegment ok = engine.allocate(g.bufferBytes(1));
            InvalidGeometryException e = assertThrows(InvalidGeometryException.class, () -> ExternalPageMemory.wrap(g,
                    new long[] {small.address(), ok.address()}, new long[] {small.byteSize(), ok.byteSize()}));
            assertTrue(e.getMessage().contains(Long.toString(g.bufferBytes(0) - 1)) && e.getMessage().contains(Long.toString(g.bufferBytes(0))),
                    e.getMessage());
            assertThrows(InvalidGeometryException.class,
                    () -> ExternalPageMemory.wrap(g, new long[] {ok.address()}, new long[] {ok.byteSize()}));
            assertThrows(InvalidGeometryException.class,
                    () -> ExternalPageMemory.wrap(g, new long[] {0, ok.address()}, new long[] {64, ok.byteSize()}));
        }
    }

    @Test
    void closingDoesNotFreeEngineMemory() {
        PoolGeometry g = PoolGeometry.builder().mla(1, 8, 1).pageSizeTokens(2).pageCount(3).build();
        try (Arena engine = Arena.ofConfined()) {
            MemorySegment buf = engine.allocate(g.bufferBytes(0));
            buf.fill((byte) 3);
            ExternalPageMemory.wrap(g, new long[] {buf.address()}, new long[] {buf.byteSize()}).close();
            assertTrue(buf.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 5) == 3, "engine memory still readable after close");
        }
    }
}
