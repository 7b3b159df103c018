package dev.kvshield.perf.cli;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;

/**
 * A model's KV shape from {@code --preset} or from explicit {@code --layers --kv-heads --head-dim}
 * (or {@code --latent-dim} for MLA) {@code --dtype --page-size} options; explicit options override
 * the preset's values. Every dimension is checked here, naming its option: a zero would otherwise
 * reach a command's own arithmetic (a division by the page size, a pool of 0-byte pages) before the
 * geometry builder could refuse it.
 */
record ModelShape(String description, int layers, int kvHeads, int headDim, int latentDim, int dtypeBytes, int pageSizeTokens,
        int presetContextTokens) {

    static ModelShape from(Args a, int defaultLayers, int defaultKvHeads, int defaultHeadDim, int defaultPageSize) {
        ModelPresets p = a.has("preset") ? ModelPresets.get(a.get("preset", "")) : null;
        int layers = a.getInt("layers", p != null ? p.layers() : defaultLayers);
        int latent = a.getInt("latent-dim", p != null ? p.latentDim() : 0);
        int kvHeads = a.getInt("kv-heads", p != null ? p.kvHeads() : defaultKvHeads);
        int headDim = a.getInt("head-dim", p != null ? p.headDim() : defaultHeadDim);
        int dtype = ModelPresets.dtypeBytes(a.get("dtype", "bf16"));
        int page = a.getInt("page-size", defaultPageSize);
        check("page-size", page, 1, PoolGeometry.MAX_PAGE_SIZE_TOKENS, "a page of " + page + " tokens holds no KV");
        check("layers", layers, 1, PoolGeometry.MAX_LAYERS, "a model of " + layers + " layers has no KV bytes per token");
        check("latent-dim", latent, 0, Integer.MAX_VALUE, "0 means MHA/GQA");
        long bytesPerTokenPerBuffer;
        if (latent > 0) {
            bytesPerTokenPerBuffer = (long) latent * dtype;
        } else {
            check("kv-heads", kvHeads, 1, Integer.MAX_VALUE, kvHeads + " KV heads hold no KV bytes per token");
            check("head-dim", headDim, 1, Integer.MAX_VALUE, "a head of " + headDim + " elements holds no KV bytes per token");
            bytesPerTokenPerBuffer = (long) kvHeads * headDim * dtype;
        }
        if (bytesPerTokenPerBuffer * page > Integer.MAX_VALUE) {
            throw new Args.UsageException("one layer's page would be " + bytesPerTokenPerBuffer + " bytes per token x " + page
                    + " tokens, over the " + Integer.MAX_VALUE + "-byte limit of a page buffer; lower --page-size or the head shape");
        }
        String what = latent > 0 ? "MLA latent " + latent : kvHeads + " KV heads x " + headDim + " head dim";
        String description = (p != null ? p.name() + " (" : "(") + layers + " layers, " + what + ", " + dtype + "-byte elements, "
                + page + "-token pages)";
        return new ModelShape(description, layers, kvHeads, headDim, latent, dtype, page, p != null ? p.contextTokens() : 0);
    }

    private static void check(String option, int value, int min, int max, String why) {
        if (value < min || value > max) {
            throw new Args.UsageException("--" + option + " must be in [" + min + ", " + max + "], not " + value + " (" + why + ")");
        }
    }

    /**
     * A geometry of this shape with {@code layersToUse} layers and {@code pageCount} pages; a pool the
     * geometry builder refuses (a buffer over its byte limit) is a usage error with the builder's reason.
     */
    PoolGeometry geometry(int layersToUse, int pageCount) {
        try {
            PoolGeometry.Builder b = PoolGeometry.builder().pageSizeTokens(pageSizeTokens).pageCount(pageCount);
            if (latentDim > 0) {
                b.mla(layersToUse, latentDim, dtypeBytes);
            } else {
                b.mha(layersToUse, kvHeads, headDim, dtypeBytes);
            }
            return b.build();
        } catch (InvalidGeometryException e) {
            throw new Args.UsageException(description + " in " + pageCount + " pages: " + e.getMessage());
        }
    }

    /** Bytes of one token across all of the model's layers and buffers. */
    long bytesPerToken() {
        long perLayer = latentDim > 0 ? (long) latentDim * dtypeBytes : 2L * kvHeads * headDim * dtypeBytes;
        return perLayer * layers;
    }
}
