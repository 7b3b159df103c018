package dev.kvshield.pool;

import dev.kvshield.lifecycle.PageTable;

/** The last "none" answer of a pool and the page counts at that moment. Guarded by the pool lock. */
final class Shortfall {
    static final int NONE = 0;
    static final int POOL = 1;
    static final int QUOTA = 2;

    private int kind = NONE;
    private int tenant;
    private int requested;
    private int quota;
    private PoolSnapshot snapshot;

    /** Records a "none" answer; returns {@code false}, the answer. */
    boolean none(int why, int tenantId, int requestedPages, int quotaPages, KvPagePool pool) {
        kind = why;
        tenant = tenantId;
        requested = requestedPages;
        quota = quotaPages;
        snapshot = pool.snapshot0();
        pool.metrics().allocationNone();
        return false;
    }

    void clear() {
        kind = NONE;
    }

    String describe(PageTable table) {
        return switch (kind) {
            case POOL -> "pool exhausted: tenant " + tenant + " asked for " + requested + " pages; " + snapshot;
            case QUOTA -> "quota exhausted: tenant " + tenant + " asked for " + requested + " pages, owns " + table.ownedBy(tenant)
                    + " of a quota of " + quota + "; " + snapshot;
            default -> "";
        };
    }
}
