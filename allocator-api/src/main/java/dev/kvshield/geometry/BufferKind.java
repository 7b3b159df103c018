package dev.kvshield.geometry;

/** What one buffer of a pool holds; every kind is token-slot indexed KV data kvshield protects. */
public enum BufferKind {
    /** Keys of a multi-head (or grouped-query) attention layer. */
    K,
    /** Values of a multi-head (or grouped-query) attention layer. */
    V,
    /** The single compressed latent of a multi-head latent attention (MLA) layer. */
    LATENT,
    /** Per-token quantisation scales of a block-scaled KV layer (FP4, MXFP8): they decode the K, V or latent bytes. */
    SCALE,
    /** A sparse-attention indexer's per-token keys (and their scales), e.g. the DSA indexer's {@code index_k_with_scale_buffer}. */
    INDEX,
    /** A per-token dequantisation workspace: plain K or V of whichever layer last used it. */
    WORKSPACE,
    /** A page-major envelope: every layer's K and V of a page in one contiguous region. */
    ENVELOPE
}
