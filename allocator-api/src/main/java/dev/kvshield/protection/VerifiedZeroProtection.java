package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;

/**
 * {@link ProtectionLevel#COMPLIANCE}: zero, then verify every byte is zero before the page can be
 * reused (a page that fails is retired), also when a sealed page is cleared for hand-out; hand-outs
 * wait until an audit trail listens. The backend may fuse scrub and verify
 * ({@link PageMemory#scrubAndVerify}).
 */
final class VerifiedZeroProtection extends Protection {
    private final int[] dirtyScratch;

    VerifiedZeroProtection(PageMemory memory) {
        super(memory);
        dirtyScratch = new int[memory.geometry().pageCount()];
    }

    @Override
    public ProtectionLevel level() {
        return ProtectionLevel.COMPLIANCE;
    }

    /** Protection batches run one at a time (the quarantine's queue), so one scratch array serves them. */
    @Override
    public int protect(int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage) {
        int dirty = memory.scrubAndVerify(pages, 0, count, dirtyScratch);
        for (int i = 0; i < dirty; i++) {
            dirtyByPage[dirtyScratch[i]] = 1;
        }
        return 0;
    }

    @Override
    public boolean verifies() {
        return true;
    }

    @Override
    public boolean verifiesHandOut() {
        return true;
    }

    @Override
    public int clearForHandOut(int[] pages, int offset, int count, int[] dirtyOut) {
        return memory.scrubAndVerify(pages, offset, count, dirtyOut);
    }
}
