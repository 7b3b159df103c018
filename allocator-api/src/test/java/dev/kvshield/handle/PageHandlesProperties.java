package dev.kvshield.handle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.constraints.IntRange;
import org.junit.jupiter.api.Test;

/** The handle codec: round trips, positivity, and NONE never a handle. */
class PageHandlesProperties {
    @Property(seed = "11")
    void encodeDecodeRoundTrips(@ForAll @IntRange(min = 0) int page, @ForAll @IntRange(min = 1) int generation) {
        long h = PageHandles.encode(page, generation);
        assertTrue(h > 0 && PageHandles.isWellFormed(h));
        assertEquals(page, PageHandles.page(h));
        assertEquals(generation, PageHandles.generation(h));
        if (generation < PageHandles.MAX_GENERATION) {
            long sealed = PageHandles.sealedReference(h);
            assertEquals(page, PageHandles.page(sealed));
            assertEquals(generation + 1, PageHandles.generation(sealed));
        }
    }

    @Property(seed = "12")
    void distinctPagesOrGenerationsGiveDistinctHandles(@ForAll @IntRange(min = 0) int p1, @ForAll @IntRange(min = 1) int g1,
            @ForAll @IntRange(min = 0) int p2, @ForAll @IntRange(min = 1) int g2) {
        assertEquals(p1 == p2 && g1 == g2, PageHandles.encode(p1, g1) == PageHandles.encode(p2, g2));
    }

    @Test
    void noneAndMalformedValuesAreNotHandles() {
        assertFalse(PageHandles.isWellFormed(PageHandles.NONE));
        assertFalse(PageHandles.isWellFormed(-1L));
        assertFalse(PageHandles.isWellFormed(5L), "generation 0 is never handed out");
        assertFalse(PageHandles.isWellFormed(PageHandles.encode(1, 1) | 0x8000_0000L), "page index beyond int range");
        assertThrows(InvalidHandleException.class, () -> PageHandles.encode(-1, 1));
        assertThrows(InvalidHandleException.class, () -> PageHandles.encode(1, 0));
        assertEquals("page=3 generation=9", PageHandles.describe(PageHandles.encode(3, 9)));
    }
}
