package dev.kvshield.pool;

import dev.kvshield.lifecycle.PageTable;

/**
 * The last "none" answer of a pool: what was asked, the pages available then, and on
 * {@link #describe} the pool's page counts. Guarded by the pool lock.
 *
 * <p>Implementation notes: a "none" answer records only O(1) figures; the page-state counts
 * ({@link PoolSnapshot}) scan the page table, so they are taken when the answer is described (callers
 * ask right after the answer, under the same lock discipline, so they see the same pool unless it
 * moved in between, which the step number shows).
 */
final class Shortfall {
    static final int NONE = 0;
    static final int POOL = 1;
    static final int QUOTA = 2;

    private int kind = NONE;
    private int tenant;
    private int requested;
    private int quota;
    private int availablePages;
    private long step;

    /** Records a "none" answer; returns {@code false}, the answer. */
    boolean none(int why, int tenantId, int requestedPages, int quotaPages, KvPagePool pool) {
        kind = why;
        tenant = tenantId;
        requested = requestedPages;
        quota = quotaPages;
        availablePages = pool.available0();
        step = pool.step0();
        pool.metrics().allocationNone();
        return false;
    }

    void clear() {
        kind = NONE;
    }

    String describe(PageTable table, KvPagePool pool) {
        if (kind == NONE) {
            return "";
        }
        PoolSnapshot now = pool.snapshot0();
        String asked = "tenant " + tenant + " asked for " + requested + " pages at step " + step + " with " + availablePages
                + " available";
        return kind == POOL ? "pool exhausted: " + asked + "; now " + now
                : "quota exhausted: " + asked + ", owns " + table.ownedBy(tenant) + " of a quota of " + quota + "; now " + now;
    }
}
