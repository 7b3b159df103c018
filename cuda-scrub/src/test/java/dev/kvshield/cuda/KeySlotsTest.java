package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.cuda.kernel.KeySlots;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.testing.Patterns;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import org.junit.jupiter.api.Test;

/** The by-value key block: slot bounds, layout, and keys gone once a launch returns. */
class KeySlotsTest {
    @Test
    void slotsTileTheParameterBlockAndRefuseOutOfRange() {
        try (KeySlots slots = new KeySlots()) {
            assertEquals(KernelAbi.KEY_SLOTS_BYTES, slots.block().byteSize());
            MemorySegment last = slots.slot(KernelAbi.MAX_KEY_SLOTS - 1);
            assertEquals(KernelAbi.KEY_BYTES, last.byteSize());
            assertEquals(slots.block().address() + KernelAbi.KEY_SLOTS_BYTES - KernelAbi.KEY_BYTES, last.address());
            assertThrows(IllegalArgumentException.class, () -> slots.slot(KernelAbi.MAX_KEY_SLOTS));
            assertThrows(IllegalArgumentException.class, () -> slots.slot(-1));
            last.fill((byte) 7);
            slots.wipe();
            assertTrue(Patterns.allZero(slots.block()));
        }
    }

    /** The host-build backend wipes the key block right after the launch, as the CUDA backend does. */
    @Test
    void keysAreWipedOnceTheLaunchReturnsAndOnAFailedLaunch() {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 8, 2).pageSizeTokens(4).pageCount(4).build();
        try (HostKernelPageMemory m = HostKernelPageMemory.allocate(g, HostKernels.require(), 2, 32)) {
            KeySlots[] seen = new KeySlots[1];
            m.chacha20Xor(new int[] {1, 2}, new int[] {1, 1}, new byte[2], 0, 2, 1, s -> {
                s.slot(0).fill((byte) 0x3C);
                seen[0] = s;
            });
            assertTrue(Patterns.allZero(seen[0].block()), "key bytes left in the launch block");
            assertThrows(IllegalStateException.class, () -> m.chacha20Xor(new int[] {1}, new int[] {2}, new byte[1], 0, 1, 1, s -> {
                s.slot(0).fill((byte) 0x3C);
                throw new IllegalStateException("key source failed");
            }));
            assertTrue(Patterns.allZero(seen[0].block()), "key bytes left after a failed load");
            MemorySegment page = m.hostRegion(1, 0);
            assertTrue(page.get(ValueLayout.JAVA_BYTE, 0) != 0 || page.get(ValueLayout.JAVA_BYTE, 1) != 0, "page 1 was not sealed");
        }
    }
}
