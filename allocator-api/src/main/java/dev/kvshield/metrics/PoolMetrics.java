package dev.kvshield.metrics;

import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.function.ToLongFunction;

/**
 * The meters of one pool, registered once at pool start; recording is allocation-free (counters
 * and timers are indexed arrays, no tag lookups on hot paths). Thread-safe.
 */
public final class PoolMetrics {
    private final Counter allocated;
    private final Counter released;
    private final Counter allocationsNone;
    private final Counter[] pagesProtected;
    private final Counter[] bytesProtected;
    private final Timer[] protectionTime;
    private final Counter[] rejections;
    private final Counter readBeforeWrite;
    private final Counter protectionFailures;
    private final Counter verifyFailures;
    private final Counter reclaimHits;
    private final Counter reclaimGone;
    private final Counter listenerFailures;

    /** Source of gauge values, read when the registry is scraped. */
    public interface GaugeSource {
        long pagesIn(PageState state);

        long claimedPages();

        long effectiveLimitTokens();

        long advertisedLimitTokens();
    }

    public PoolMetrics(MeterRegistry registry, String poolId, int rank, GaugeSource source) {
        Tags base = Tags.of("pool", poolId, "rank", Integer.toString(rank));
        for (PageState state : PageState.values()) {
            gauge(registry, MetricNames.PAGES, base.and("state", tag(state)), "pages", source, s -> s.pagesIn(state));
        }
        gauge(registry, MetricNames.PAGES, base.and("state", "claimed"), "pages", source, GaugeSource::claimedPages);
        gauge(registry, MetricNames.ADMISSION_LIMIT, base.and("kind", "effective"), "tokens", source,
                GaugeSource::effectiveLimitTokens);
        gauge(registry, MetricNames.ADMISSION_LIMIT, base.and("kind", "advertised"), "tokens", source,
                GaugeSource::advertisedLimitTokens);
        allocated = counter(registry, MetricNames.PAGES_ALLOCATED, base, "pages");
        released = counter(registry, MetricNames.PAGES_RELEASED, base, "pages");
        allocationsNone = counter(registry, MetricNames.ALLOCATIONS_NONE, base, "calls");
        ProtectionLevel[] levels = ProtectionLevel.values();
        pagesProtected = new Counter[levels.length];
        bytesProtected = new Counter[levels.length];
        protectionTime = new Timer[levels.length];
        for (ProtectionLevel level : levels) {
            Tags t = base.and("level", tag(level));
            pagesProtected[level.ordinal()] = counter(registry, MetricNames.PAGES_PROTECTED, t, "pages");
            bytesProtected[level.ordinal()] = counter(registry, MetricNames.BYTES_PROTECTED, t, "bytes");
            protectionTime[level.ordinal()] = Timer.builder(MetricNames.PROTECTION_TIME).tags(t)
                    .description("time in backend protection calls").register(registry);
        }
        Rejection[] kinds = Rejection.values();
        rejections = new Counter[kinds.length];
        for (Rejection r : kinds) {
            rejections[r.ordinal()] = counter(registry, MetricNames.REJECTIONS, base.and("reason", r.tag()), "calls");
        }
        readBeforeWrite = counter(registry, MetricNames.READ_BEFORE_WRITE, base, "calls");
        protectionFailures = counter(registry, MetricNames.PROTECTION_FAILURES, base, "pages");
        verifyFailures = counter(registry, MetricNames.VERIFY_FAILURES, base, "pages");
        reclaimHits = counter(registry, MetricNames.RECLAIMS, base.and("outcome", "hit"), "pages");
        reclaimGone = counter(registry, MetricNames.RECLAIMS, base.and("outcome", "gone"), "pages");
        listenerFailures = counter(registry, MetricNames.LISTENER_FAILURES, base, "events");
    }

    private static String tag(Enum<?> e) {
        return e.name().toLowerCase(Locale.ROOT);
    }

    private static Counter counter(MeterRegistry registry, String name, Tags tags, String unit) {
        return Counter.builder(name).tags(tags).baseUnit(unit).register(registry);
    }

    private static void gauge(MeterRegistry registry, String name, Tags tags, String unit, GaugeSource source,
            ToLongFunction<GaugeSource> f) {
        // Strong reference: Micrometer holds gauge state weakly, and nothing else keeps the source alive.
        Gauge.builder(name, source, s -> f.applyAsLong(s)).tags(tags).baseUnit(unit).strongReference(true).register(registry);
    }

    public void allocated(int pages) {
        allocated.increment(pages);
    }

    public void released(int pages) {
        released.increment(pages);
    }

    public void allocationNone() {
        allocationsNone.increment();
    }

    public void protectedPages(ProtectionLevel level, int pages, long bytes, long nanos) {
        pagesProtected[level.ordinal()].increment(pages);
        bytesProtected[level.ordinal()].increment(bytes);
        protectionTime[level.ordinal()].record(nanos, TimeUnit.NANOSECONDS);
    }

    public void rejected(Rejection kind) {
        rejections[kind.ordinal()].increment();
    }

    public void readBeforeWrite() {
        readBeforeWrite.increment();
    }

    public void protectionFailed(int pages) {
        protectionFailures.increment(pages);
    }

    public void verifyFailed(int pages) {
        verifyFailures.increment(pages);
    }

    public void reclaimed(boolean hit) {
        (hit ? reclaimHits : reclaimGone).increment();
    }

    public void listenerFailed() {
        listenerFailures.increment();
    }

    public double rejections(Rejection kind) {
        return rejections[kind.ordinal()].count();
    }

    public double pagesProtected(ProtectionLevel level) {
        return pagesProtected[level.ordinal()].count();
    }

    public double bytesProtected(ProtectionLevel level) {
        return bytesProtected[level.ordinal()].count();
    }

    public double protectionSeconds(ProtectionLevel level) {
        return protectionTime[level.ordinal()].totalTime(TimeUnit.NANOSECONDS) / 1e9;
    }

    public double readBeforeWriteCount() {
        return readBeforeWrite.count();
    }

    public double verifyFailureCount() {
        return verifyFailures.count();
    }

    public double protectionFailureCount() {
        return protectionFailures.count();
    }

    public double reclaimCount(boolean hit) {
        return (hit ? reclaimHits : reclaimGone).count();
    }
}
