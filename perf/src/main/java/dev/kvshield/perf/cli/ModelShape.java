package dev.kvshield.perf.cli;

import dev.kvshield.geometry.PoolGeometry;

/**
 * A model's KV shape from {@code --preset} or from explicit {@code --layers --kv-heads --head-dim}
 * (or {@code --latent-dim} for MLA) {@code --dtype --page-size} options; explicit options override
 * the preset's values.
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
        String what = latent > 0 ? "MLA latent " + latent : kvHeads + " KV heads x " + headDim + " head dim";
        String description = (p != null ? p.name() + " (" : "(") + layers + " layers, " + what + ", " + dtype + "-byte elements, "
                + page + "-token pages)";
        return new ModelShape(description, layers, kvHeads, headDim, latent, dtype, page, p != null ? p.contextTokens() : 0);
    }

    /** A geometry of this shape with {@code layersToUse} layers and {@code pageCount} pages. */
    PoolGeometry geometry(int layersToUse, int pageCount) {
        PoolGeometry.Builder b = PoolGeometry.builder().pageSizeTokens(pageSizeTokens).pageCount(pageCount);
        if (latentDim > 0) {
            b.mla(layersToUse, latentDim, dtypeBytes);
        } else {
            b.mha(layersToUse, kvHeads, headDim, dtypeBytes);
        }
        return b.build();
    }

    /** Bytes of one token across all of the model's layers and buffers. */
    long bytesPerToken() {
        long perLayer = latentDim > 0 ? (long) latentDim * dtypeBytes : 2L * kvHeads * headDim * dtypeBytes;
        return perLayer * layers;
    }
}
