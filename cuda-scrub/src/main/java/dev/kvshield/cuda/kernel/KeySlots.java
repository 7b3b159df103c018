package dev.kvshield.cuda.kernel;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * The by-value key parameter of one chacha20-xor launch ({@code struct KvsKeys}): up to
 * {@link KernelAbi#MAX_KEY_SLOTS} 32-byte keys, each page of the batch naming its slot. Keys are
 * written just before a launch and {@link #wipe() wiped} right after it, so key bytes exist only
 * in this off-heap block for the duration of one launch and in the launch's own parameters; no
 * key table lives in device memory.
 *
 * <p>No {@code toString}, {@code equals} or {@code hashCode}: nothing may print it. Not
 * thread-safe; each backend owns one and uses it under its launch lock.
 */
public final class KeySlots implements AutoCloseable {
    private final Arena arena = Arena.ofShared();
    private final MemorySegment block = arena.allocate(KernelAbi.KEY_SLOTS_BYTES, 16);

    /** The 32 bytes of slot {@code slot}, for the key source to copy a key into. */
    public MemorySegment slot(int slot) {
        if (slot < 0 || slot >= KernelAbi.MAX_KEY_SLOTS) {
            throw new IllegalArgumentException("key slot " + slot + " outside [0, " + KernelAbi.MAX_KEY_SLOTS + ")");
        }
        return block.asSlice((long) slot * KernelAbi.KEY_BYTES, KernelAbi.KEY_BYTES);
    }

    /** The whole parameter block, passed by value to the kernel. */
    public MemorySegment block() {
        return block;
    }

    /** Zeroes every slot. */
    public void wipe() {
        block.fill((byte) 0);
    }

    @Override
    public void close() {
        wipe();
        arena.close();
    }
}
