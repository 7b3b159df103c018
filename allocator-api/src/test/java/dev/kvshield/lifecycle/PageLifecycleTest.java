package dev.kvshield.lifecycle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.EnumSet;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The state table itself: the transitions the design allows and nothing else. */
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
}
