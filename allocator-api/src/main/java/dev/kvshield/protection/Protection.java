package dev.kvshield.protection;

import dev.kvshield.memory.PageMemory;

/**
 * What one protection level does to a page between owners: one class per level, bound to a pool's
 * memory (and key source) by {@link ProtectionLevel#bind}. The pool asks its strategy, never the
 * level, what to run on release, whether released pages stay reclaimable, how a sealed page is
 * cleared before another tenant gets it, and whether hand-outs need an audit trail.
 *
 * <p>A failure of {@link #protect} or {@link #clearForHandOut} is the same at every level: the
 * pages' bytes are in an unknown state, so the pool keeps them out of reach, scrubs them and
 * retires them ({@code quarantine.Quarantine}); it never returns them to FREE.
 *
 * <p>Thread-safe for calls over disjoint pages (a protection worker protects while the scheduler
 * thread clears sealed pages for hand-out).
 */
public abstract sealed class Protection permits NoProtection, ZeroProtection, SealProtection, VerifiedZeroProtection {
    protected final PageMemory memory;

    Protection(PageMemory memory) {
        this.memory = memory;
    }

    public abstract ProtectionLevel level();

    /**
     * Protects released pages of one tenant; returns only when the work is confirmed complete.
     *
     * @param generations each page's generation after its release (a sealer's nonce input)
     * @param dirtyByPage set to 1 at the index of each page found not zero after its scrub
     * @return the key epoch the pages were sealed under, or 0 when nothing is sealed
     * @throws RuntimeException if the work failed; the pages' bytes are then unknown
     */
    public abstract int protect(int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage);

    /** Whether {@link #protect} checks each page after its work, marking those it finds not zero in {@code dirtyByPage}. */
    public boolean verifies() {
        return false;
    }

    /** Whether protected pages become SEALED (reclaimable by their tenant) rather than FREE. */
    public boolean seals() {
        return false;
    }

    /** Whether pages handed to a tenant at this level are audited: hand-outs wait until an audit trail listens. */
    public final boolean requiresAuditTrail() {
        return level().requiresAuditTrail();
    }

    /** Bytes {@link #protect} rewrites for {@code count} pages (the protection-bandwidth metric). */
    public long bytesTouched(int count) {
        return (long) count * memory.geometry().pageBytesAllBuffers();
    }

    /** The strategy a release by {@code tenant} gets now (a tenant that cannot seal is zeroed instead). */
    public Protection forRelease(int tenant) {
        return this;
    }

    /** Whether {@link #clearForHandOut} verifies what it cleared (a batch for several tenants clears with the strictest). */
    public boolean verifiesHandOut() {
        return false;
    }

    /**
     * Clears sealed pages (another owner's ciphertext) before they are handed to a tenant at this
     * level; pages that are not zero afterwards go to {@code dirtyOut} from index 0.
     *
     * @return how many pages are not zero ({@code 0}: all may be handed out)
     * @throws RuntimeException if the scrub failed; the pages' bytes are then unknown
     */
    public int clearForHandOut(int[] pages, int offset, int count, int[] dirtyOut) {
        memory.scrub(pages, offset, count);
        return 0;
    }
}
