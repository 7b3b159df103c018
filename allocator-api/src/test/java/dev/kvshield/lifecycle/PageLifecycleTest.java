package dev.kvshield.lifecycle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.EnumMap;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The state table itself: the transitions the design allows and nothing else, and the page table's moves agreeing with it. */
class PageLifecycleTest {
    @Test
    void pagesAreHandedOutOnlyFromFreeOrSealed() {
        Set<PageState> handOut = EnumSet.noneOf(PageState.class);
        for (PageState s : PageState.values()) {
            if (PageLifecycle.canHandOut(s)) {
                handOut.add(s);
            }
        }
        assertEquals(EnumSet.of(PageState.FREE, PageState.SEALED), handOut);
    }

    @Test
    void freeAndSealedAreReachedOnlyThroughConfirmedProtection() {
        for (PageState from : PageState.values()) {
            for (PageTransition t : PageTransition.values()) {
                PageState to = PageLifecycle.target(from, t);
                if (to == PageState.FREE) {
                    assertEquals(PageTransition.PROTECTED_FREE, t);
                    assertEquals(PageState.QUARANTINED, from);
                }
                if (to == PageState.SEALED) {
                    assertEquals(PageTransition.PROTECTED_SEALED, t);
                }
            }
        }
    }

    @Test
    void retiredIsFinalAndOwnedPagesCannotSkipQuarantine() {
        for (PageTransition t : PageTransition.values()) {
            assertNull(PageLifecycle.target(PageState.RETIRED, t), "RETIRED must be final: " + t);
        }
        for (PageTransition t : PageTransition.values()) {
            PageState to = PageLifecycle.target(PageState.OWNED, t);
            assertTrue(to == null || to == PageState.QUARANTINED, "OWNED may only go to QUARANTINED, not " + to);
        }
        assertFalse(PageLifecycle.isAllowed(PageState.FREE, PageTransition.RECLAIM));
        IllegalStateException e = assertThrows(IllegalStateException.class,
                () -> PageLifecycle.next(PageState.FREE, PageTransition.RELEASE, 3));
        assertEquals("illegal page transition RELEASE from FREE (page 3)", e.getMessage());
    }

    /** A legal walk from FREE to each state, so the page table's own move can be tried from every state. */
    private static final Map<PageState, List<PageTransition>> WALK_TO = new EnumMap<>(Map.of(
            PageState.FREE, List.of(),
            PageState.OWNED, List.of(PageTransition.ALLOCATE),
            PageState.QUARANTINED, List.of(PageTransition.ALLOCATE, PageTransition.RELEASE),
            PageState.SEALED, List.of(PageTransition.ALLOCATE, PageTransition.RELEASE, PageTransition.PROTECTED_SEALED),
            PageState.RETIRED, List.of(PageTransition.RETIRE)));

    @Test
    void pageTableMovesExactlyAsTheTableSays() {
        assertEquals(EnumSet.allOf(PageState.class), WALK_TO.keySet());
        for (PageState from : PageState.values()) {
            for (PageTransition t : PageTransition.values()) {
                PageTable table = new PageTable(4, 1, true);
                int page = 3;
                WALK_TO.get(from).forEach(step -> table.move(page, step));
                assertEquals(from, table.state(page));
                PageState to = PageLifecycle.target(from, t);
                if (to == null) {
                    IllegalStateException e = assertThrows(IllegalStateException.class, () -> table.move(page, t), from + " " + t);
                    assertEquals("illegal page transition " + t + " from " + from + " (page 3)", e.getMessage());
                    assertEquals(from, table.state(page), "a refused move leaves the page where it was");
                } else {
                    table.move(page, t);
                    assertEquals(to, table.state(page), from + " " + t);
                }
            }
        }
    }
}
