package dev.kvshield.audit;

/**
 * Page life-cycle events and rejections. The {@code detail} argument of
 * {@link PageEventListener#onPageEvent} means, per type:
 *
 * <table>
 *   <caption>detail per event type</caption>
 *   <tr><th>type</th><th>detail</th></tr>
 *   <tr><td>WRITE, READ</td><td>{@code (firstSlot << 32) | endSlot}, end exclusive</td></tr>
 *   <tr><td>CLAIM_TAKEN, CLAIM_DROPPED, CLAIM_FENCED</td><td>the claim id</td></tr>
 *   <tr><td>RELEASE</td><td>{@link ReleaseReason} ordinal</td></tr>
 *   <tr><td>PROTECT_ISSUED, PROTECT_DONE, PROTECT_FAILED</td><td>{@code ProtectionLevel} ordinal</td></tr>
 *   <tr><td>SEAL, RECLAIM, SHRED</td><td>key epoch</td></tr>
 *   <tr><td>RETIRE</td><td>{@link RetireReason} ordinal</td></tr>
 *   <tr><td>OWNERSHIP_TRANSFER</td><td>the previous owner reference</td></tr>
 *   <tr><td>READER_ADDED, READER_REMOVED</td><td>the reader's request id</td></tr>
 *   <tr><td>HOLD_ADDED, HOLD_DROPPED</td><td>the {@code LeaseKind} ordinal of the hold (a page keeps its
 *       owner's generation while other holds remain; RELEASE marks the last hold going)</td></tr>
 *   <tr><td>REJECT_*</td><td>the rejected lease id or sealed reference as given</td></tr>
 *   <tr><td>others</td><td>0</td></tr>
 * </table>
 */
public enum PageEventType {
    ALLOCATE,
    RECLAIM,
    WRITE,
    READ,
    OWNERSHIP_TRANSFER,
    READER_ADDED,
    READER_REMOVED,
    CLAIM_TAKEN,
    CLAIM_DROPPED,
    CLAIM_FENCED,
    RELEASE,
    PROTECT_ISSUED,
    PROTECT_DONE,
    PROTECT_FAILED,
    VERIFY_FAILED,
    SEAL,
    FREE,
    SHRED,
    RETIRE,
    REJECT_STALE,
    REJECT_DOUBLE_FREE,
    REJECT_FOREIGN,
    REJECT_READ_BEFORE_WRITE,
    REJECT_REVOKED_CLAIM,
    HOLD_ADDED,
    HOLD_DROPPED;

    // Kept per constant: the trail asks for every event it encodes.
    private final boolean rejection = name().startsWith("REJECT_");

    public boolean isRejection() {
        return rejection;
    }

    /**
     * Whether the event gives its holder a page's bytes: a read, and a hand-out or a reclaim (which a trail without
     * reads judges as the holder's read). The events whose exposure the trail records and the exposure query reports.
     */
    public boolean isReceipt() {
        return this == READ || this == ALLOCATE || this == RECLAIM;
    }
}
