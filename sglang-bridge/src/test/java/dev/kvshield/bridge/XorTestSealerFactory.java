package dev.kvshield.bridge;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * A test-only key source for {@code ENCRYPT} (tenant-keys provides the real one): XORs every byte
 * of a page with a byte derived from tenant, page and generation. Loaded by class name through
 * {@link BridgeSettings#SEALER_FACTORY}, as tenant-keys' factory will be.
 */
public final class XorTestSealerFactory implements PageSealerFactory {
    @Override
    public PageSealer create(Context context) {
        PageMemory memory = context.memory();
        int buffers = context.geometry().bufferCount();
        return new PageSealer() {
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

            @Override
            public boolean isEpochAvailable(int tenant, int epoch) {
                return true;
            }

            @Override
            public void shred(int tenant) {}

            private void xor(int tenant, int[] pages, int[] generations, int offset, int count) {
                for (int i = offset; i < offset + count; i++) {
                    byte key = (byte) (0x5A ^ (tenant * 31 + pages[i] * 7 + generations[i]));
                    for (int b = 0; b < buffers; b++) {
                        MemorySegment region = memory.hostRegion(pages[i], b);
                        for (long k = 0; k < region.byteSize(); k++) {
                            region.set(ValueLayout.JAVA_BYTE, k, (byte) (region.get(ValueLayout.JAVA_BYTE, k) ^ key));
                        }
                    }
                }
            }
        };
    }
}
