package dev.kvshield.lease;

import dev.kvshield.claims.ClaimKind;

/**
 * What a hold on a page is for. Content holds keep the page's data alive: while a page has one, it
 * stays OWNED at its generation; when the last one goes, its generation moves and it is
 * quarantined. Claims fence protection: a quarantined page is protected only when its last claim
 * is dropped.
 */
public enum LeaseKind {
    /** The request computing the page; it may write and read. */
    OWNER(true, true, true, true),
    /** A tenant's cache namespace holding a page past its request (a prefix cache). */
    NAMESPACE(true, true, true, true),
    /** The decode side's reservation for an incoming handoff, written through a writer claim. */
    RESERVATION(true, true, true, true),
    /** A request reading a page another holder keeps (a shared prefix); read only. */
    READER(true, false, true, false),
    /** A free the engine asked for and the pool applies later (a deferred or grouped free). */
    DEFERRED_FREE(true, false, false, false),
    /** An in-flight transfer writing the page (a KV transfer landing, a DMA engine). */
    CLAIM_WRITER(false, true, false, false),
    /** An in-flight transfer reading the page (a KV transfer sending). */
    CLAIM_READER(false, false, true, false);

    private static final LeaseKind[] VALUES = values();

    private final boolean content;
    private final boolean writes;
    private final boolean reads;
    private final boolean proves;

    LeaseKind(boolean content, boolean writes, boolean reads, boolean proves) {
        this.content = content;
        this.writes = writes;
        this.reads = reads;
        this.proves = proves;
    }

    /** A content hold (keeps the page OWNED) rather than a claim (fences its protection). */
    public boolean holdsContent() {
        return content;
    }

    public boolean isClaim() {
        return !content;
    }

    /** Whether a holder of this kind may write the page's KV. */
    public boolean mayWrite() {
        return writes;
    }

    /** Whether a holder of this kind may read the page's KV (only slots written in its generation). */
    public boolean mayRead() {
        return reads;
    }

    /** Whether this kind may prove a hold to share the page with another holder (readers and claims may not). */
    public boolean mayShare() {
        return proves;
    }

    public static LeaseKind ofClaim(ClaimKind kind) {
        return kind == ClaimKind.WRITER ? CLAIM_WRITER : CLAIM_READER;
    }

    public static LeaseKind ofOrdinal(int ordinal) {
        return VALUES[ordinal];
    }
}
