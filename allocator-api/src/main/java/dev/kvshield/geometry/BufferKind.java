package dev.kvshield.geometry;

/** What one per-layer buffer holds. */
public enum BufferKind {
    /** Keys of a multi-head (or grouped-query) attention layer. */
    K,
    /** Values of a multi-head (or grouped-query) attention layer. */
    V,
    /** The single compressed latent of a multi-head latent attention (MLA) layer. */
    LATENT
}
