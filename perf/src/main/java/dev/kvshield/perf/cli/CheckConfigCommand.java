package dev.kvshield.perf.cli;

import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.geometry.PoolGeometry;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.Locale;
import java.util.Set;

/**
 * {@code check-config}: does a pool of this model geometry and size hold one advertised max-length
 * request with the configured headroom? Uses the pool's own admission arithmetic
 * ({@link AdmissionLimits}, exact decimal headroom). Exit code 0 when it does, 2 (with both numbers)
 * when it does not or when no pool of that size can be built; 64 for a dimension or size that is no
 * model or pool at all (a usage error naming the option).
 */
final class CheckConfigCommand {
    /** Pages a pool can have: its page index is an {@code int}. */
    private static final long MAX_PAGES = Integer.MAX_VALUE;
    private static final long GIB = 1L << 30;
    static final Set<String> OPTIONS = Set.of("preset", "layers", "kv-heads", "head-dim", "latent-dim", "dtype", "page-size",
            "gpu-memory-gib", "pool-tokens", "context", "headroom");

    private CheckConfigCommand() {}

    static int run(String[] argv, PrintStream out) {
        Args a = new Args("check-config", argv, OPTIONS, Set.of());
        if (!a.positional().isEmpty()) {
            throw new Args.UsageException("check-config takes no positional arguments: " + a.positional());
        }
        if (!a.has("preset") && !(a.has("layers") && (a.has("latent-dim") || a.has("kv-heads") && a.has("head-dim")))) {
            throw new Args.UsageException("check-config needs --preset NAME or --layers N with --kv-heads N --head-dim N"
                    + " (or --latent-dim N for MLA); presets: " + String.join(", ", ModelPresets.ALL.keySet()));
        }
        ModelShape shape = ModelShape.from(a, 0, 0, 0, 16);
        if (a.has("gpu-memory-gib") == a.has("pool-tokens")) {
            throw new Args.UsageException("check-config needs exactly one of --gpu-memory-gib GIB (memory for KV) or"
                    + " --pool-tokens N");
        }
        long context = a.getLong("context", shape.presetContextTokens());
        if (context <= 0) {
            throw new Args.UsageException("check-config needs --context TOKENS (the advertised context length)");
        }
        BigDecimal headroom = a.getDecimal("headroom", BigDecimal.ZERO);
        if (headroom.signum() < 0 || headroom.compareTo(BigDecimal.ONE) >= 0) {
            throw new Args.UsageException("--headroom must be in [0, 1) (the share of the pool kept free), not " + a.get("headroom", ""));
        }
        AdmissionPolicy policy = new AdmissionPolicy(context, headroom, false);
        long bytesPerToken = shape.bytesPerToken();
        long pageBytes = bytesPerToken * shape.pageSizeTokens();
        // Page counts in exact arithmetic: a pool too large for the page index must not wrap or saturate into "too small".
        BigInteger pages;
        if (a.has("gpu-memory-gib")) {
            BigDecimal gib = a.getDecimal("gpu-memory-gib", BigDecimal.ZERO);
            if (gib.signum() <= 0) {
                throw new Args.UsageException("--gpu-memory-gib must be positive, not " + a.get("gpu-memory-gib", ""));
            }
            // Capped at one page over the index's limit: what matters beyond it is only that it is beyond.
            BigDecimal page = BigDecimal.valueOf(pageBytes);
            BigDecimal kvBytes = gib.multiply(BigDecimal.valueOf(GIB)).min(page.multiply(BigDecimal.valueOf(MAX_PAGES + 1)));
            pages = kvBytes.divideToIntegralValue(page).toBigIntegerExact();
        } else {
            long tokens = a.getLong("pool-tokens", 0);
            if (tokens <= 0) {
                throw new Args.UsageException("--pool-tokens must be positive: " + tokens);
            }
            pages = BigInteger.valueOf(tokens / shape.pageSizeTokens()).add(BigInteger.ONE);
        }
        if (pages.compareTo(BigInteger.valueOf(MAX_PAGES)) > 0) {
            out.printf(Locale.ROOT, "check-config: %s: %s pages of %d bytes; a pool's page index holds at most %d pages (a smaller"
                    + " pool or a larger --page-size)%n", shape.description(), a.has("gpu-memory-gib") ? "over " + MAX_PAGES : pages,
                    pageBytes, MAX_PAGES);
            return 2;
        }
        if (pages.intValueExact() < 2) {
            out.printf(Locale.ROOT, "check-config: %s: %d pages of %d bytes fit; the pool needs at least 2 (page 0 is reserved)%n",
                    shape.description(), pages, pageBytes);
            return 2;
        }
        PoolGeometry g = shape.geometry(shape.layers(), pages.intValueExact());
        AdmissionLimits limits = AdmissionLimits.compute(g, policy);
        out.println("model:            " + shape.description());
        out.printf(Locale.ROOT, "bytes per token:  %d (%.1f KiB) across all layers; page %d bytes%n", bytesPerToken,
                bytesPerToken / 1024.0, pageBytes);
        out.printf(Locale.ROOT, "pool:             %d pages (page 0 reserved) = %d token slots, %.2f GiB%n", pages,
                g.capacityTokens(), pages.doubleValue() * pageBytes / GIB);
        out.printf(Locale.ROOT, "headroom:         %s of the pool kept free for other requests%n", headroom.toPlainString());
        out.printf(Locale.ROOT, "advertised:       %d tokens%n", context);
        out.printf(Locale.ROOT, "pool holds:       %d tokens for one request%n", limits.poolHoldsTokens());
        if (limits.isLowered()) {
            // The inverse of the pool's own rounding (AdmissionPolicy), so the advice is never one page short or one too many.
            long neededSlots = policy.slotsToHold(context);
            long neededPages = neededSlots == Long.MAX_VALUE ? Long.MAX_VALUE : Math.ceilDiv(neededSlots, shape.pageSizeTokens()) + 1;
            String needed = neededPages > MAX_PAGES ? "more than the " + MAX_PAGES + " pages a pool's page index holds"
                    : String.format(Locale.ROOT, "%d pages (%.2f GiB of KV)", neededPages, neededPages * (double) pageBytes / GIB);
            out.printf(Locale.ROOT, "NOT OK: the pool cannot hold one max-length request: advertised %d tokens, pool holds %d;"
                    + " kvshield would admit only requests up to %d tokens. Needed: %s or advertise <= %d.%n",
                    context, limits.poolHoldsTokens(), limits.effectiveTokens(), needed, limits.poolHoldsTokens());
            return 2;
        }
        out.printf(Locale.ROOT, "OK: the pool holds a max-length request of %d tokens with %s headroom (%d tokens to spare)%n",
                context, headroom.toPlainString(), limits.poolHoldsTokens() - context);
        return 0;
    }
}
