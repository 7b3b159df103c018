package dev.kvshield.lifecycle;

/** Where a page is in its life cycle; see {@link PageLifecycle} for the transitions. */
public enum PageState {
    /** Zeroed (or, at level NONE, released without scrub) and ready to hand out. */
    FREE,
    /** Holds only ciphertext of its last owner's tenant; may be handed out (zeroed) or reclaimed by that tenant. */
    SEALED,
    /** Owned by one tenant plus request or cache namespace, at the page's current generation. */
    OWNED,
    /** Released; its generation already bumped; waiting for claims to drain and protection to be confirmed. */
    QUARANTINED,
    /** Never handed out again: generation exhausted, verification failed, or operator action. */
    RETIRED;

    private static final PageState[] VALUES = values();

    public static PageState ofOrdinal(int ordinal) {
        return VALUES[ordinal];
    }
}
