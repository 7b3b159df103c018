package dev.kvshield.testing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import java.lang.foreign.Arena;
import java.lang.foreign.ValueLayout;
import java.util.Set;

/**
 * What the pool says about every page (state, generation, tenant, holds, claims, sealed-for, its
 * earliest prover lease) and the bytes it holds: the owners-and-bytes oracle of failure tests. A
 * failed call must leave every page's record as it was, except the pages its failed work touched,
 * which must be out of reach: quarantined as failed, then retired and zero after the next step
 * boundary.
 */
public record PageRecords(KvPagePool pool, PageMemory memory, Page[] pages) {
    /** One page's record. */
    public record Page(PageState state, int generation, int tenant, int contentHolds, int claims, int sealedFor, long primaryLease,
            byte[] bytes) {
        String describe() {
            return state + " gen=" + generation + " tenant=" + tenant + " holds=" + contentHolds + " claims=" + claims + " sealedFor="
                    + sealedFor + " primary=" + primaryLease;
        }
    }

    public static PageRecords capture(KvPagePool pool, PageMemory memory) {
        Page[] pages = new Page[pool.geometry().pageCount()];
        try (Arena arena = Arena.ofConfined()) {
            for (int p = 0; p < pages.length; p++) {
                pages[p] = new Page(pool.view().stateOf(p), pool.view().generationOf(p), pool.view().tenantOf(p),
                        pool.view().contentHolds(p), pool.view().claims(p), pool.view().sealedFor(p), pool.view().primaryLeaseOf(p),
                        PoolProbe.rawPage(memory, arena, p).toArray(ValueLayout.JAVA_BYTE));
            }
        }
        return new PageRecords(pool, memory, pages);
    }

    public Page page(int p) {
        return pages[p];
    }

    public static boolean allZero(byte[] bytes) {
        for (byte b : bytes) {
            if (b != 0) {
                return false;
            }
        }
        return true;
    }

    /** Asserts every page outside {@code touched} has the record and bytes it had in {@code before}. */
    public void assertSameAs(PageRecords before, Set<Integer> touched, String where) {
        for (int p = 0; p < pages.length; p++) {
            if (touched.contains(p)) {
                continue;
            }
            Page was = before.pages[p];
            Page now = pages[p];
            assertEquals(was.describe(), now.describe(), where + ": page " + p + " changed although the failed work never touched it");
            assertArrayEquals(was.bytes(), now.bytes(), where + ": the bytes of page " + p + " changed");
        }
    }

    /** Asserts the touched pages are out of reach now: quarantined, held by no one, counted as failed. */
    public void assertQuarantinedAsFailed(Set<Integer> touched, String where) {
        for (int p : touched) {
            assertEquals(PageState.QUARANTINED, pages[p].state(), where + ": page " + p + " the failed work touched is not out of reach");
            assertEquals(0, pages[p].contentHolds() + pages[p].claims(), where + ": page " + p + " is failed but still held");
            assertEquals(-1, pages[p].sealedFor(), where + ": page " + p + " is failed but still reclaimable");
        }
        assertTrue(pool.snapshot().failed() >= touched.size(), where + ": " + pool.snapshot());
    }

    /** Asserts the touched pages are retired and zero (after the step boundary that follows the failure). */
    public void assertRetiredAndZero(Set<Integer> touched, String where) {
        for (int p : touched) {
            assertEquals(PageState.RETIRED, pages[p].state(), where + ": page " + p);
            assertTrue(allZero(pages[p].bytes()), where + ": retired page " + p + " was not scrubbed");
        }
    }

    /**
     * Asserts no page another holder could get next holds written data: every FREE page is zero and
     * no SEALED page holds a whole buffer of any pattern in {@code written} (tenant, request pairs).
     */
    public void assertNothingLeftInCirculation(long[][] written, String where) {
        try (Arena arena = Arena.ofConfined()) {
            for (int p = 0; p < pages.length; p++) {
                if (pages[p].state() == PageState.FREE) {
                    assertTrue(allZero(pages[p].bytes()), where + ": FREE page " + p + " holds bytes");
                }
                if (pages[p].state() == PageState.SEALED) {
                    for (long[] w : written) {
                        assertTrue(!PoolProbe.holdsPattern(memory, arena, p, (int) w[0], w[1]),
                                where + ": SEALED page " + p + " holds the plaintext of tenant " + w[0] + " request " + w[1]);
                    }
                }
            }
        }
    }
}
