package dev.kvshield.perf.testing;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;

/**
 * A test-only sealer: XORs each page region with a keystream drawn from a seeded generator per
 * (tenant, page, generation, buffer). Not a cipher; it lets perf's tests run ENCRYPT (seal,
 * zero-at-hand-out, reclaim) without the tenant-keys module.
 */
public final class XorTestSealer implements PageSealer {
    private final PageMemory memory;

    private XorTestSealer(PageMemory memory) {
        this.memory = memory;
    }

    public static PageSealerFactory factory() {
        return context -> new XorTestSealer(context.memory());
    }

    @Override
    public boolean canSeal(int tenant) {
        return true;
    }

    @Override
    public int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
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
                SplittableRandom keystream = new SplittableRandom(((long) tenant << 48) ^ ((long) pages[i] << 24) ^ generations[i] * 31L ^ b);
                for (long at = 0; at < region.byteSize(); at += 8) {
                    region.set(ValueLayout.JAVA_LONG_UNALIGNED, at, region.get(ValueLayout.JAVA_LONG_UNALIGNED, at) ^ keystream.nextLong());
                }
            }
        }
    }

    @Override
    public boolean isEpochAvailable(int tenant, int epoch) {
        return epoch == 1;
    }

    @Override
    public void shred(int tenant) {
        throw new UnsupportedOperationException("the test sealer does not shred");
    }
}
