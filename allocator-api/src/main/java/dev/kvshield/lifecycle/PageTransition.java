package dev.kvshield.lifecycle;

/** The events that move a page between {@link PageState}s. */
public enum PageTransition {
    /** Handed to a new owner (a SEALED page is zeroed first). */
    ALLOCATE,
    /** Same-tenant reclaim of a SEALED page: decrypted in place and owned again. */
    RECLAIM,
    /** Released by its owner; the generation is bumped in the same step. */
    RELEASE,
    /** At a step boundary: scrub (and verify) confirmed complete, or level NONE. */
    PROTECTED_FREE,
    /** At a step boundary: seal confirmed complete. */
    PROTECTED_SEALED,
    /** Work on a SEALED page failed (clearing it for hand-out, unsealing it): back to quarantine for scrub and retirement. */
    PROTECTION_FAILED,
    /** Taken out of circulation for good. */
    RETIRE
}
