package dev.kvshield.claims;

/** What the claimant does to the page. */
public enum ClaimKind {
    /** Writes into the page (the receiving side of a transfer). */
    WRITER,
    /** Reads from the page (the sending side of a transfer). */
    READER
}
