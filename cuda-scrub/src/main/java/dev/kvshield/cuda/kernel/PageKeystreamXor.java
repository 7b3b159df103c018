package dev.kvshield.cuda.kernel;

import dev.kvshield.memory.PageMemory;

/**
 * Page memory that also XORs pages in place with their ChaCha20 keystream in one fused launch: the
 * CUDA backend, and in tests the kernels' host build. What a GPU sealer drives.
 */
public interface PageKeystreamXor extends PageMemory {
    /** Writes the keys of one launch into its slots; called under the backend's launch lock. */
    @FunctionalInterface
    interface KeyLoader {
        void load(KeySlots slots);
    }

    /**
     * XORs every buffer of {@code pages[offset .. offset+count)} in place with its ChaCha20
     * keystream (seal and unseal are the same operation): page {@code pages[i]} at generation
     * {@code generations[i]} under the key in slot {@code keySlots[i]}; nonce = (page, generation,
     * global buffer index), block counter = byte offset in the page region / 64, as tenant-keys
     * defines them. {@code keys} writes the batch's {@code keyCount} distinct keys into the
     * launch's slots; they are wiped as soon as the launch is enqueued, or when {@code keys}
     * throws (then nothing is launched and no byte changes). Pages must be distinct. One launch;
     * returns when the work is confirmed complete.
     *
     * @throws IllegalArgumentException for repeated pages, bad key slots or ranges (nothing changed)
     * @throws dev.kvshield.geometry.InvalidGeometryException for a page out of range (nothing changed)
     */
    void chacha20Xor(int[] pages, int[] generations, byte[] keySlots, int offset, int count, int keyCount, KeyLoader keys);
}
