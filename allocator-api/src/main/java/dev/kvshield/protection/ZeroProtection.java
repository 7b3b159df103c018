package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;

/** {@link ProtectionLevel#ZERO}: every buffer of a released page is zeroed. */
final class ZeroProtection extends Protection {
    ZeroProtection(PageMemory memory) {
        super(memory);
    }

    @Override
    public ProtectionLevel level() {
        return ProtectionLevel.ZERO;
    }

    @Override
    public int protect(int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage) {
        memory.scrub(pages, 0, count);
        return 0;
    }
}
