package dev.kvshield.audit;

/** Why a page left circulation for good. */
public enum RetireReason {
    GENERATION_EXHAUSTED,
    VERIFY_FAILED,
    OPERATOR
}
