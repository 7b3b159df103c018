package dev.kvshield.pool;

import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.metrics.PoolMetrics;

/** A pool's gauge values, read when the registry is scraped (racy reads of counts: a scrape is a sample). */
final class PoolGauges implements PoolMetrics.GaugeSource {
    private final PageTable table;
    private final AdmissionLimits admission;
    private LeaseTable leases;

    PoolGauges(PageTable table, AdmissionLimits admission) {
        this.table = table;
        this.admission = admission;
    }

    /** The lease table exists after the metrics it reports into. */
    void bind(LeaseTable leaseTable) {
        this.leases = leaseTable;
    }

    @Override
    public long pagesIn(PageState s) {
        return table.count(s);
    }

    @Override
    public long claimedPages() {
        return leases == null ? 0 : leases.claimedPages();
    }

    @Override
    public long effectiveLimitTokens() {
        return admission.effectiveTokens();
    }

    @Override
    public long advertisedLimitTokens() {
        return admission.advertisedTokens();
    }
}
