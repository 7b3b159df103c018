package dev.kvshield.perf.prefix;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.prefix.PrefixCache;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.util.Arrays;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * Tenants with one system prompt each send requests of that prompt plus a unique suffix into a pool
 * too small to keep every prompt resident. The cache keeps at most {@code cap} pages resident (an
 * operator's bound that leaves room for decode) and evicts least recently used pages beyond it, and
 * on demand when an allocation finds no room. Under ZERO an evicted prompt is gone; under ENCRYPT it
 * is sealed and stays reclaimable until the pool hands the page to someone else. Reports the share
 * of prompt pages served from the cache (resident or reclaimed) per level, from the same seeded
 * request sequence.
 *
 * <p>Usage: {@code PrefixReuseExperiment [requests] [tenants] [seed] [residentCapPages]}; a cap of -1
 * evicts only on demand (what SGLang's radix cache does by default), the default cap is a quarter of
 * all tenants' prompt pages.
 */
public final class PrefixReuseExperiment {
    static final int PAGE_TOKENS = 16;
    static final int PROMPT_PAGES = 8;
    static final int SUFFIX_PAGES = 4;

    /** Outcome of one run. */
    public record Result(ProtectionLevel level, long promptPages, long servedFromCache, long reclaimedPages, long reclaimGone) {
        public double hitRate() {
            return promptPages == 0 ? 0 : (double) servedFromCache / promptPages;
        }
    }

    public static Result run(ProtectionLevel level, int requests, int tenants, long seed, int residentCap) {
        // Room for about half the tenants' prompts plus a few requests in flight.
        int pages = tenants * PROMPT_PAGES / 2 + 4 * (PROMPT_PAGES + SUFFIX_PAGES) + 1;
        PoolGeometry g = PoolGeometry.builder().mha(2, 2, 64, 2).pageSizeTokens(PAGE_TOKENS).pageCount(pages).build();
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g);
                RootKeySource keys = RootKeySource.ephemeral();
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(level).sealer(new HostPageSealerFactory(keys)).build(),
                        memory)) {
            int[] tenantIds = new int[tenants];
            for (int t = 0; t < tenants; t++) {
                tenantIds[t] = pool.tenants().register("tenant-" + t);
            }
            PrefixCache cache = new PrefixCache(pool);
            SplittableRandom random = new SplittableRandom(seed);
            long served = 0;
            long asked = 0;
            int total = PROMPT_PAGES + SUFFIX_PAGES;
            for (int r = 0; r < requests; r++) {
                // Skewed popularity: low tenant ids come back more often.
                int t = (int) Math.min(tenants - 1, Math.abs(random.nextGaussian()) * tenants / 2.5);
                int tenant = tenantIds[t];
                int[] tokens = prompt(t, r, total);
                long[] matched = new long[PROMPT_PAGES];
                int hit = cache.match(tenant, r, Arrays.copyOf(tokens, PROMPT_PAGES * PAGE_TOKENS), matched);
                served += hit;
                asked += PROMPT_PAGES;
                long[] fresh = new long[total - hit];
                while (!pool.allocate(tenant, Owners.request(r), LeaseKind.OWNER, fresh.length, fresh, 0)) {
                    if (cache.evict(fresh.length) == 0) {
                        throw new IllegalStateException("pool too small for one request: " + pool.lastShortfall());
                    }
                    pool.endStep();
                }
                for (long lease : fresh) {
                    pool.markWritten(tenant, Owners.request(r), lease, 0, PAGE_TOKENS);
                }
                // The request's prompt pages it computed go into the cache; then it stops reading the
                // pages it matched, and its suffix pages are freed.
                int computedPrompt = PROMPT_PAGES - hit;
                cache.insert(tenant, r, Arrays.copyOfRange(tokens, 0, PROMPT_PAGES * PAGE_TOKENS), promptLeases(matched, hit, fresh,
                        computedPrompt));
                cache.unmatch(tenant, r, matched, hit);
                pool.release(tenant, Owners.request(r), fresh, computedPrompt, SUFFIX_PAGES, ReleaseReason.FINISHED);
                int over = cache.residentPages() - residentCap;
                if (residentCap >= 0 && over > 0) {
                    cache.evict(over);
                }
                pool.endStep();
            }
            return new Result(level, asked, served, cache.reclaimHits(), cache.reclaimGone());
        }
    }

    /** The full prompt's leases for insert: the reader leases of matched pages, then the owner leases of computed ones. */
    private static long[] promptLeases(long[] matched, int hit, long[] fresh, int computedPrompt) {
        long[] h = new long[hit + computedPrompt];
        System.arraycopy(matched, 0, h, 0, hit);
        System.arraycopy(fresh, 0, h, hit, computedPrompt);
        return h;
    }

    private static int[] prompt(int tenant, int request, int pages) {
        int[] tokens = new int[pages * PAGE_TOKENS];
        for (int i = 0; i < tokens.length; i++) {
            tokens[i] = i < PROMPT_PAGES * PAGE_TOKENS ? tenant * 100_000 + i : -(request * 1000 + i);
        }
        return tokens;
    }

    public static void main(String[] args) {
        int requests = args.length > 0 ? Integer.parseInt(args[0]) : 2000;
        int tenants = args.length > 1 ? Integer.parseInt(args[1]) : 16;
        long seed = args.length > 2 ? Long.parseLong(args[2]) : 20261202L;
        int cap = args.length > 3 ? Integer.parseInt(args[3]) : tenants * PROMPT_PAGES / 4;
        System.out.println("resident cap: " + (cap < 0 ? "none (evict on demand only)" : cap + " pages"));
        System.out.printf(Locale.ROOT, "%-8s %12s %12s %9s %10s %12s%n", "level", "promptPages", "fromCache", "hitRate", "reclaimed",
                "reclaimGone");
        for (ProtectionLevel level : new ProtectionLevel[] {ProtectionLevel.ZERO, ProtectionLevel.ENCRYPT}) {
            Result r = run(level, requests, tenants, seed, cap);
            System.out.printf(Locale.ROOT, "%-8s %12d %12d %8.1f%% %10d %12d%n", level, r.promptPages(), r.servedFromCache(),
                    100 * r.hitRate(), r.reclaimedPages(), r.reclaimGone());
        }
    }

    private PrefixReuseExperiment() {}
}
