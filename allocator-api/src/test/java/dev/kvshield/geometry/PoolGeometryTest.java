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

    @Test
    void explicitBuffersKeepTheirOwnWidthsKindsAndLabelsInOrder() {
        PoolGeometry g = PoolGeometry.builder().pageSizeTokens(4).pageCount(5)
                .buffer(BufferKind.K, "target.k_buffer[0]", 64).buffer(BufferKind.SCALE, "target.k_scale_buffer[0]", 4)
                .buffer(BufferKind.INDEX, "target.index[0]", 132).buffer(BufferKind.K, "draft.k_buffer[0]", 48).build();
        assertEquals(4, g.bufferCount());
        assertEquals(List.of(64, 4, 132, 48), List.of(g.bytesPerToken(0), g.bytesPerToken(1), g.bytesPerToken(2), g.bytesPerToken(3)));
        assertEquals(4L * 4, g.pageBytes(1));
        assertEquals(4L * 132 * 5, g.bufferBytes(2));
        assertEquals(4L * (64 + 4 + 132 + 48), g.pageBytesAllBuffers());
        assertEquals(4L * 132, g.maxPageBytes());
        assertEquals(BufferKind.K, g.kindOf(3));
        assertEquals("draft.k_buffer[0]", g.labelOf(3));
        assertEquals("buffer 1 (target.k_scale_buffer[0] SCALE)", g.describeBuffer(1));
        // Read as one layer of every buffer, so layer-wise callers see each buffer exactly once.
        assertEquals(1, g.layers());
        assertEquals(4, g.buffersPerLayer());
        assertEquals(List.of(BufferKind.K, BufferKind.SCALE, BufferKind.INDEX, BufferKind.K), g.kinds());
        assertEquals(2, g.bufferIndex(0, 2));
        assertEquals(0, g.layerOf(3));
        assertTrue(g.toString().contains("target.index[0] INDEX 132"), g.toString());
        assertMessage(() -> g.bytesPerToken(4), "buffer 4 out of range [0, 4)");
        assertMessage(() -> g.slotByteOffset(1, 2, 0, 100), "100 bytes is not a whole number of 132-byte tokens of buffer 2"
                + " (target.index[0] INDEX)");
    }

    @Test
    void layeredGeometriesKeepTheirMeaning() {
        PoolGeometry g = PoolGeometry.builder().layers(3).buffers(List.of(BufferKind.K, BufferKind.V), 6, 10).pageSizeTokens(7)
                .pageCount(4).build();
        assertTrue(g.isLayered());
        assertEquals(List.of(BufferKind.K, BufferKind.V), g.kinds());
        assertEquals(10, g.bytesPerToken(5));
        assertEquals("layer 2 V", g.labelOf(5));
        assertEquals(7L * 16 * 3, g.pageBytesAllBuffers());
        assertEquals(70, g.maxPageBytes());
    }

    @Test
    void badExplicitListsAreRefusedNamingTheBuffer() {
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4).pageCount(5).buffer(BufferKind.K, "a", 4)
                .buffer(BufferKind.V, "a", 4).build(), "buffer label 'a' repeats (buffer 1)");
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4).pageCount(5).buffer(BufferKind.K, "a", 0).build(), "a=0");
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4).pageCount(5).buffer(BufferKind.K, " ", 4).build(),
                "buffer 0 needs a printable ASCII label");
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4).pageCount(5).buffer(BufferKind.K, "bad\nlabel", 4).build(),
                "'bad?label'");
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4).pageCount(5).buffer(null, "a", 4).build(), "buffer 0 has no kind");
        assertMessage(() -> PoolGeometry.builder().mha(2, 1, 4, 2).pageSizeTokens(4).pageCount(5).buffer(BufferKind.K, "a", 4).build(),
                "either layered");
        assertMessage(() -> PoolGeometry.builder().pageSizeTokens(4096).pageCount(5).buffer(BufferKind.INDEX, "huge", 1 << 20).build(),
                "one page of huge would be");
    }

    private static void assertMessage(org.junit.jupiter.api.function.Executable call, String part) {
        InvalidGeometryException e = assertThrows(InvalidGeometryException.class, call);
        assertTrue(e.getMessage().contains(part), e.getMessage());
    }
}
