package dev.kvshield.audit;

/**
 * Receives page events, synchronously, on the thread that caused them, while the pool holds its
 * lock: keep it short and never call back into the pool. Primitive arguments so delivery does not
 * allocate. A listener that throws is counted and does not stop the pool, except under
 * {@code COMPLIANCE}, where an audit that cannot be written must stop hand-outs (the audit trail
 * does that through {@link dev.kvshield.pool.KvPagePool#haltHandOuts}).
 */
@FunctionalInterface
public interface PageEventListener {
    /**
     * @param type what happened
     * @param page the page index, or -1 for an event about a malformed handle
     * @param generation the page's generation the event refers to
     * @param tenant the tenant involved, or -1
     * @param owner the owner reference involved (see {@link dev.kvshield.tenant.Owners}), or -1
     * @param detail per-type detail, see {@link PageEventType}
     */
    void onPageEvent(PageEventType type, int page, int generation, int tenant, long owner, long detail);

    /**
     * Claim events ({@code CLAIM_TAKEN}, {@code CLAIM_DROPPED}, {@code CLAIM_FENCED}) with the claim's
     * kind and peer; by default forwarded to {@link #onPageEvent} with the claim id as detail.
     */
    default void onClaimEvent(PageEventType type, int page, int generation, int tenant, long owner, long claimId,
            dev.kvshield.claims.ClaimKind kind, long peer) {
        onPageEvent(type, page, generation, tenant, owner, claimId);
    }

    /** Called at every step boundary with its number, after the boundary's events. */
    default void onStepBoundary(long step) {}

    /**
     * For an audit trail: why it records nothing from now on (closed, or its sink failed), or
     * {@code null} while it records. Read on every hand-out to a tenant whose level requires a
     * trail, so it must be a cheap read, safe from any thread.
     */
    default String notRecording() {
        return null;
    }
}
