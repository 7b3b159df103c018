package dev.kvshield.testing;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HashSet;
import java.util.Set;
import java.util.SplittableRandom;

/**
 * A stand-in sealer for pool tests (not a cipher): XORs a keystream seeded by (tenant, page,
 * generation, buffer) and refuses to seal a (page, generation) twice. The real ChaCha20 sealer is in
 * tenant-keys.
 */
public class TestXorSealer implements PageSealer {
    final PageMemory memory;
    final Set<Long> sealedOnce = new HashSet<>();
    final Set<Integer> shredded = new HashSet<>();

    public TestXorSealer(PageMemory memory) {
        this.memory = memory;
    }

    @Override
    public boolean canSeal(int tenant) {
        return !shredded.contains(tenant);
    }

    @Override
    public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            if (!sealedOnce.add(((long) pages[i] << 32) | generations[i])) {
                throw new IllegalStateException("page " + pages[i] + " generation " + generations[i] + " sealed twice");
            }
        }
        xor(tenant, pages, generations, offset, count);
        return 1;
    }

    @Override
    public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        xor(tenant, pages, generations, offset, count);
    }

    private void xor(int tenant, int[] pages, int[] generations, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            for (int b = 0; b < memory.geometry().bufferCount(); b++) {
                MemorySegment region = memory.hostRegion(pages[i], b);
                SplittableRandom stream = new SplittableRandom(tenant * 1_000_003L + pages[i] * 7919L + generations[i] * 31L + b);
                for (long o = 0; o < region.byteSize(); o++) {
                    region.set(ValueLayout.JAVA_BYTE, o, (byte) (region.get(ValueLayout.JAVA_BYTE, o) ^ stream.nextInt()));
                }
            }
        }
    }

    @Override
    public boolean isEpochAvailable(int tenant, int epoch) {
        return !shredded.contains(tenant);
    }

    @Override
    public void shred(int tenant) {
        shredded.add(tenant);
    }
}

