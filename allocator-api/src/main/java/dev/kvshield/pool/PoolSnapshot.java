package dev.kvshield.pool;

/**
 * Page counts of a pool at one moment (taken under the pool lock, so they add up).
 *
 * @param free FREE pages
 * @param sealed SEALED pages
 * @param owned OWNED pages
 * @param quarantined QUARANTINED pages (awaiting claims, queued, or failed)
 * @param retired RETIRED pages
 * @param awaitingClaims quarantined pages whose protection waits for claims to drain
 * @param queued quarantined pages whose protection is queued or done but not yet collected
 * @param failed quarantined pages whose last protection attempt failed
 * @param claimedPages pages with at least one live or revoked claim
 * @param liveClaims live claims
 * @param revokedClaims fenced claims not yet drained
 * @param available pages {@code allocate} can hand out now ({@code free + sealed + reusable queued})
 * @param step step boundaries passed
 */
public record PoolSnapshot(int free, int sealed, int owned, int quarantined, int retired, int awaitingClaims, int queued,
        int failed, int claimedPages, int liveClaims, int revokedClaims, int available, long step) {

    /** Pages in any state, page 0 excluded when reserved. */
    public int total() {
        return free + sealed + owned + quarantined + retired;
    }

    @Override
    public String toString() {
        return "free=" + free + " sealed=" + sealed + " owned=" + owned + " quarantined=" + quarantined + " (awaitingClaims="
                + awaitingClaims + " queued=" + queued + " failed=" + failed + ") claimedPages=" + claimedPages + " liveClaims="
                + liveClaims + " revokedClaims=" + revokedClaims + " retired=" + retired + " available=" + available
                + " step=" + step;
    }
}
