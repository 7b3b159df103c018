package dev.kvshield.lifecycle;

import static dev.kvshield.lifecycle.PageState.FREE;
import static dev.kvshield.lifecycle.PageState.OWNED;
import static dev.kvshield.lifecycle.PageState.QUARANTINED;
import static dev.kvshield.lifecycle.PageState.RETIRED;
import static dev.kvshield.lifecycle.PageState.SEALED;

import java.util.EnumMap;
import java.util.Map;

/**
 * The page state machine, defined once:
 *
 * <pre>
 * FREE ──ALLOCATE──> OWNED ──RELEASE (generation + 1)──> QUARANTINED
 *  ^                  ^  ^                                 │ claims drained, then protection
 *  │                  │  └───────ALLOCATE (zeroed) ─┐      │ confirmed at a step boundary
 *  │                  └──RECLAIM (decrypted)──── SEALED <──┤ PROTECTED_SEALED (ENCRYPT)
 *  └──────────────────────────────────────────────────────┘ PROTECTED_FREE   (NONE, ZERO, COMPLIANCE)
 * PROTECTION_FAILED: SEALED ──> QUARANTINED (clearing or unsealing it failed; scrubbed, then retired)
 * RETIRE: from FREE, SEALED or QUARANTINED (generation exhausted, verify failed, protection failed, operator)
 * </pre>
 *
 * <p>Invariants the pool keeps around this table: a page is handed out only from FREE or SEALED; it
 * enters FREE or SEALED only after the backend confirmed its protection and only at a step
 * boundary (or a drain under allocation pressure); a page whose protection (or other work on its
 * bytes) failed never returns to FREE or SEALED; RETIRED is final.
 */
public final class PageLifecycle {
    private static final Map<PageState, Map<PageTransition, PageState>> TABLE = new EnumMap<>(PageState.class);

    static {
        for (PageState s : PageState.values()) {
            TABLE.put(s, new EnumMap<>(PageTransition.class));
        }
        allow(FREE, PageTransition.ALLOCATE, OWNED);
        allow(SEALED, PageTransition.ALLOCATE, OWNED);
        allow(SEALED, PageTransition.RECLAIM, OWNED);
        allow(OWNED, PageTransition.RELEASE, QUARANTINED);
        allow(QUARANTINED, PageTransition.PROTECTED_FREE, FREE);
        allow(QUARANTINED, PageTransition.PROTECTED_SEALED, SEALED);
        allow(SEALED, PageTransition.PROTECTION_FAILED, QUARANTINED);
        allow(FREE, PageTransition.RETIRE, RETIRED);
        allow(SEALED, PageTransition.RETIRE, RETIRED);
        allow(QUARANTINED, PageTransition.RETIRE, RETIRED);
    }

    private static final PageState[][] NEXT = new PageState[PageState.values().length][PageTransition.values().length];
    /** The table by transition ordinal, for the page table's hot path: the states each may start from, one bit per state ordinal. */
    private static final int[] SOURCES = new int[PageTransition.values().length];
    /** The one state each transition leads to, whatever its source (the table has no other kind; checked below). */
    private static final byte[] TARGET = new byte[PageTransition.values().length];

    static {
        java.util.Arrays.fill(TARGET, (byte) -1);
        TABLE.forEach((from, row) -> row.forEach((t, to) -> {
            NEXT[from.ordinal()][t.ordinal()] = to;
            if (TARGET[t.ordinal()] >= 0 && TARGET[t.ordinal()] != to.ordinal()) {
                throw new AssertionError(t + " leads to two states; PageTable.move assumes one");
            }
            TARGET[t.ordinal()] = (byte) to.ordinal();
            SOURCES[t.ordinal()] |= 1 << from.ordinal();
        }));
    }

    private PageLifecycle() {}

    private static void allow(PageState from, PageTransition t, PageState to) {
        TABLE.get(from).put(t, to);
    }

    /** The state {@code transition} leads to from {@code from}, or {@code null} if it is not allowed. */
    public static PageState target(PageState from, PageTransition transition) {
        return NEXT[from.ordinal()][transition.ordinal()];
    }

    public static boolean isAllowed(PageState from, PageTransition transition) {
        return target(from, transition) != null;
    }

    /**
     * The state after {@code transition}; throws {@link IllegalStateException} for a transition the
     * table forbids (a kvshield bug, never a caller error: callers are rejected earlier).
     */
    public static PageState next(PageState from, PageTransition transition, int page) {
        PageState to = target(from, transition);
        if (to == null) {
            throw new IllegalStateException("illegal page transition " + transition + " from " + from + " (page " + page + ")");
        }
        return to;
    }

    /**
     * {@link #next} by ordinals, without allocation or enum lookups.
     *
     * <p>Implementation notes: the check and the target are read per transition, not per (state,
     * transition), so the new state does not wait on the old one's load: this runs three times per
     * page over its life on every hot path.
     */
    public static byte nextOrdinal(byte fromOrdinal, PageTransition transition, int page) {
        int t = transition.ordinal();
        if ((SOURCES[t] >>> fromOrdinal & 1) == 0) {
            throw illegal(fromOrdinal, transition, page);
        }
        return TARGET[t];
    }

    private static IllegalStateException illegal(byte fromOrdinal, PageTransition transition, int page) {
        return new IllegalStateException("illegal page transition " + transition + " from " + PageState.ofOrdinal(fromOrdinal)
                + " (page " + page + ")");
    }

    /** States from which a page may be handed to an owner. */
    public static boolean canHandOut(PageState state) {
        return isAllowed(state, PageTransition.ALLOCATE);
    }
}
