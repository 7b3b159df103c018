package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;

/** {@link ProtectionLevel#NONE}: bytes stay as they are; every guard still runs. */
final class NoProtection extends Protection {
    NoProtection(PageMemory memory) {
        super(memory);
    }

    @Override
    public ProtectionLevel level() {
        return ProtectionLevel.NONE;
    }

    @Override
    public int protect(int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage) {
        return 0;
    }

    @Override
    public long bytesTouched(int count) {
        return 0;
    }
}
