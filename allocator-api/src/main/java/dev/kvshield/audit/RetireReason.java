package dev.kvshield.audit;

/** Why a page left circulation for good. */
public enum RetireReason {
    GENERATION_EXHAUSTED,
    VERIFY_FAILED,
    OPERATOR,
    /** Protection (or other work on the page's bytes) failed: scrubbed, then retired, never reused. */
    PROTECTION_FAILED
}
