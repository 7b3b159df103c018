package dev.kvshield.metrics;

import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.ToDoubleFunction;

/**
 * Per-tenant series, only for tenants that opted in, so label cardinality stays bounded by the
 * operator's list (at most {@value #MAX_OPTED_IN} names). Today: {@value MetricNames#TENANT_PAGES_OWNED}.
 */
public final class TenantMetrics {
    public static final int MAX_OPTED_IN = 64;

    private TenantMetrics() {}

    /**
     * Registers the per-tenant gauges of one pool for each opted-in tenant name.
     *
     * @param pagesOwned pages a tenant (by name) owns now, or {@code NaN} if the pool does not know
     *     it yet; read at scrape time, e.g. {@code name -> pool.ownedBy(pool.tenants().idOf(name))}
     */
    public static void register(MeterRegistry registry, String poolId, int rank, Set<String> optedIn,
            ToDoubleFunction<String> pagesOwned) {
        if (optedIn.size() > MAX_OPTED_IN) {
            throw new IllegalArgumentException(optedIn.size() + " tenants opted in to per-tenant metrics; at most " + MAX_OPTED_IN
                    + " are allowed (label cardinality)");
        }
        Tags base = Tags.of("pool", poolId, "rank", Integer.toString(rank));
        for (String name : new TreeSet<>(optedIn)) {
            Gauge.builder(MetricNames.TENANT_PAGES_OWNED, () -> pagesOwned.applyAsDouble(name)).tags(base.and("tenant", name))
                    .baseUnit("pages").description("pages owned by an opted-in tenant").register(registry);
        }
    }
}
