package dev.kvshield.perf.cli;

import dev.kvshield.admission.AdmissionLimits;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.geometry.PoolGeometry;
import java.io.PrintStream;
import java.util.Locale;
import java.util.Set;

/**
 * {@code check-config}: does a pool of this model geometry and size hold one advertised max-length
 * request with the configured headroom? Uses the pool's own admission arithmetic
 * ({@link AdmissionLimits}). Exit code 0 when it does, 2 (with both numbers) when it does not.
 */
final class CheckConfigCommand {
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
        double headroom = a.getDouble("headroom", 0.0);
        long bytesPerToken = shape.bytesPerToken();
        long pageBytes = bytesPerToken * shape.pageSizeTokens();
        long pages;
        if (a.has("gpu-memory-gib")) {
            double gib = a.getDouble("gpu-memory-gib", 0);
            if (!(gib > 0)) {
                throw new Args.UsageException("--gpu-memory-gib must be positive: " + gib);
            }
            pages = (long) Math.floor(gib * (1L << 30) / pageBytes);
        } else {
            long tokens = a.getLong("pool-tokens", 0);
            if (tokens <= 0) {
                throw new Args.UsageException("--pool-tokens must be positive: " + tokens);
            }
            pages = tokens / shape.pageSizeTokens() + 1;
        }
        if (pages < 2 || pages > Integer.MAX_VALUE) {
            out.printf(Locale.ROOT, "check-config: %s: %d pages of %d bytes fit; the pool needs at least 2 (page 0 is reserved)%n",
                    shape.description(), pages, pageBytes);
            return 2;
        }
        PoolGeometry g = shape.geometry(shape.layers(), (int) pages);
        AdmissionLimits limits = AdmissionLimits.compute(g, new AdmissionPolicy(context, headroom, false));
        out.println("model:            " + shape.description());
        out.printf(Locale.ROOT, "bytes per token:  %d (%.1f KiB) across all layers; page %d bytes%n", bytesPerToken,
                bytesPerToken / 1024.0, pageBytes);
        out.printf(Locale.ROOT, "pool:             %d pages (page 0 reserved) = %d token slots, %.2f GiB%n", pages,
                g.capacityTokens(), pages * (double) pageBytes / (1L << 30));
        out.printf(Locale.ROOT, "headroom:         %.3f of the pool kept free for other requests%n", headroom);
        out.printf(Locale.ROOT, "advertised:       %d tokens%n", context);
        out.printf(Locale.ROOT, "pool holds:       %d tokens for one request%n", limits.poolHoldsTokens());
        if (limits.isLowered()) {
            long neededSlots = (long) Math.ceil(context / (1.0 - headroom));
            long neededPages = (neededSlots + shape.pageSizeTokens() - 1) / shape.pageSizeTokens() + 1;
            out.printf(Locale.ROOT, "NOT OK: the pool cannot hold one max-length request: advertised %d tokens, pool holds %d;"
                    + " kvshield would admit only requests up to %d tokens. Needed: %d pages (%.2f GiB of KV) or advertise <= %d.%n",
                    context, limits.poolHoldsTokens(), limits.effectiveTokens(), neededPages, neededPages * (double) pageBytes / (1L << 30),
                    limits.poolHoldsTokens());
            return 2;
        }
        out.printf(Locale.ROOT, "OK: the pool holds a max-length request of %d tokens with %.3f headroom (%d tokens to spare)%n",
                context, headroom, limits.poolHoldsTokens() - context);
        return 0;
    }
}
