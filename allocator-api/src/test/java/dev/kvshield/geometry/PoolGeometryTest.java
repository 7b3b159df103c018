package dev.kvshield.geometry;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class PoolGeometryTest {
    @Test
    void mhaGeometryNumbersBuffersLayerMajor() {
        PoolGeometry g = PoolGeometry.builder().mha(32, 8, 128, 2).pageSizeTokens(16).pageCount(1001).build();
        assertEquals(64, g.bufferCount());
        assertEquals(2048, g.bytesPerToken(5));
        assertEquals(BufferKind.V, g.kindOf(5));
        assertEquals(2, g.layerOf(5));
        assertEquals(5, g.bufferIndex(2, 1));
        assertEquals(16L * 2048, g.pageBytes(0));
        assertEquals(16L * 2048 * 64, g.pageBytesAllBuffers());
        assertEquals(16_000, g.capacityTokens());
        assertEquals(1, g.firstUsablePage());
    }

    @Test
    void mlaHasOneLatentBufferPerLayer() {
        PoolGeometry g = PoolGeometry.builder().mla(61, 576, 2).pageSizeTokens(64).pageCount(10).build();
        assertEquals(61, g.bufferCount());
        assertEquals(List.of(BufferKind.LATENT), g.kinds());
        assertEquals(1152, g.bytesPerToken(60));
    }

    @Test
    void badGeometriesAreRefusedNamingTheValue() {
        assertMessage(() -> PoolGeometry.builder().mha(0, 8, 128, 2).pageSizeTokens(16).pageCount(10).build(), "layers=0");
        assertMessage(() -> PoolGeometry.builder().mha(2, 8, 128, 2).pageSizeTokens(0).pageCount(10).build(), "pageSizeTokens=0");
        assertMessage(() -> PoolGeometry.builder().mha(2, 8, 128, 2).pageSizeTokens(8192).pageCount(10).build(), "pageSizeTokens=8192");
        assertMessage(() -> PoolGeometry.builder().mha(2, 8, 128, 2).pageSizeTokens(16).pageCount(1).build(), "pageCount=1");
        assertMessage(() -> PoolGeometry.builder().mha(2, -8, 128, 2).pageSizeTokens(16).pageCount(10).build(), "kvHeads=-8");
        assertMessage(() -> PoolGeometry.builder().layers(2).pageSizeTokens(16).pageCount(10).build(), "at least one buffer");
        assertMessage(() -> PoolGeometry.builder().layers(2).buffers(List.of(BufferKind.K, BufferKind.K), 4, 4).pageSizeTokens(16)
                .pageCount(10).build(), "repeat");
        assertMessage(() -> PoolGeometry.builder().mha(2, 65536, 128, 2).pageSizeTokens(4096).pageCount(10).build(), "over the");
        assertMessage(() -> PoolGeometry.builder().mha(2, 1, 4, 2).pageSizeTokens(4).pageCount(10).build().bufferIndex(2, 0),
                "layer=2");
    }

    private static void assertMessage(org.junit.jupiter.api.function.Executable call, String part) {
        InvalidGeometryException e = assertThrows(InvalidGeometryException.class, call);
        assertTrue(e.getMessage().contains(part), e.getMessage());
    }
}
