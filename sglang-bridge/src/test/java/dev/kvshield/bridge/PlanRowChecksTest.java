package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

/**
 * Plan rows that do not add up are refused with nothing applied: an unattributed row of another tenant than the
 * default, two rows extending one partial page, a request id under two tenants, a negative row count; and an alloc
 * that changes nothing (refused, or answering -2 for a missing {@code last_loc}) leaves the caller's plan and the
 * counters as they were.
 */
class PlanRowChecksTest extends SmallPoolFixture {
    /**
     * Rule (lead's decision): unattributed holds are the default tenant's, the only tenant whose
     * unattributed holds an engine free (request -1) presents; the plug-in writes every unattributed row with the default
     * tenant. An unattributed row naming another tenant (here bravo) is refused before anything changes, so alloc and free
     * stay symmetric: the default tenant's unattributed pages are freed by the engine's free, none leak.
     */
    @Test
    void unattributedPagesOfANonDefaultTenantCanNeverBeFreed() {
        SlotAllocator a = allocator(1);
        int bravo = a.tenantId("bravo");
        long before = a.availableTokens();
        long digest = a.pool().stateDigest();
        row(0, -1, bravo, 0, 4, -1);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> a.alloc(4, 1, 0));
        assertEquals(true, e.getMessage().contains("tenant " + bravo), e.getMessage());
        assertEquals(digest, a.pool().stateDigest());
        assertEquals(0, a.unattributedPages());
        row(0, -1, a.defaultTenant(), 0, 4, -1);
        assertEquals(4, a.alloc(4, 1, 0));
        assertEquals(0, a.free(4, -1, -1, 0)); // the engine frees exactly what it was given
        a.endStep();
        assertEquals(0, a.rejectedFrees());
        assertEquals(before, a.availableTokens(), "unattributed pages leaked");
    }

    /**
     * Promise (alloc javadoc: "-1 when the pool (or a tenant's quota) cannot give them ...; nothing changed"; brief:
     * counters such as planMismatches untouched by a call that changes nothing): {@code planMismatches++} runs before the
     * allocation is attempted, so an alloc that returns -1 still bumps the counter.
     */
    @Test
    void failedAllocStillCountsAPlanMismatch() {
        SlotAllocator a = allocator(1);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, (int) a.availableTokens(), -1);
        assertEquals(a.availableTokens(), a.alloc(a.availableTokens(), 1, 0)); // pool now full, attributed, no mismatch
        assertEquals(0, a.planMismatches());
        row(0, 6, t, 0, 3, -1); // 3 planned pages for a 4-slot alloc: a mismatch, and the pool is full
        assertEquals(-1, a.alloc(4, 1, 0));
        assertEquals(0, a.planMismatches(), "alloc returned -1 (nothing changed) but counted a plan mismatch");
    }

    /**
     * Promise (allocExtend javadoc: "-2 when a row needs last_loc and its request holds no page at that position here
     * ...: the caller passes it explicitly. Nothing changed in either case"): {@code deriveLastLocs} writes each derived
     * {@code last_loc} into the caller's shared plan buffer row by row, so when a later row returns -2 (or the
     * extend_num_tokens check then throws) the earlier rows of the caller's plan have been rewritten.
     */
    @Test
    void allocExtendReturningMinusTwoRewritesTheCallersPlan() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        row(0, -1, a.defaultTenant(), 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        row(0, 5, t, 6, 7, -1); // derivable from request 5's list
        row(1, -1, a.defaultTenant(), 6, 7, -1); // unattributed: not derivable, -2
        assertEquals(-2, a.allocExtend(2, 2, 0));
        assertEquals(-1, plan.get(4), "row 0's last_loc was rewritten by a call that changed nothing");
    }

    /**
     * Promise (brief: "plan rows that do not add up" are refused with nothing applied; class javadoc: each row's
     * {@code [prefix, seq)} is the request's): two rows of the same request that both extend position 6 from the same
     * partial page are accepted, and io gets the same slot twice: two tokens of the step are written to one KV slot.
     */
    @Test
    void twoRowsExtendingTheSamePartialPageGetTheSameSlot() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        row(0, 5, t, 6, 7, -1);
        row(1, 5, t, 6, 7, -1);
        long digest = a.pool().stateDigest();
        long got;
        try {
            got = a.allocExtend(2, 2, 0);
        } catch (IllegalArgumentException refused) {
            assertEquals(digest, a.pool().stateDigest());
            return;
        }
        assertEquals(2, got);
        assertNotEquals(io.get(0), io.get(1), "one slot handed out for two tokens of one step");
    }

    /**
     * Rule: a request id belongs to one tenant, the tenant of the pages it holds here. A plan row
     * naming it with another tenant (here bravo's row for alpha's request 7) throws naming both tenants, nothing changed;
     * a release naming it with another tenant presents that tenant's holds (none: nothing released); alpha's request keeps
     * its pages and its decode.
     */
    @Test
    void sameRequestIdUnderTwoTenantsBreaksTheSecondTenantsDecode() {
        SlotAllocator a = allocator(4);
        int alpha = a.tenantId("alpha");
        int bravo = a.tenantId("bravo");
        row(0, 7, alpha, 0, 6, -1);
        assertEquals(6, a.allocExtend(1, 6, 0));
        long digest = a.pool().stateDigest();
        row(0, 7, bravo, 0, 6, -1);
        RuntimeException e = assertThrows(dev.kvshield.tenant.ForeignAccessException.class, () -> a.allocExtend(1, 6, 0));
        assertEquals(true, e.getMessage().contains("alpha") && e.getMessage().contains("bravo"), e.getMessage());
        assertEquals(digest, a.pool().stateDigest());
        assertEquals(0, a.releaseLeftovers(7, bravo, 0));
        assertEquals(2, a.heldPages(7));
        row(0, 7, alpha, 6, 7, -1);
        assertEquals(1, a.allocExtend(1, 1, 0));
        assertEquals(alpha, a.tenantOf((int) (io.get(0) / 4)));
    }

    /**
     * Promise (brief: bad input, e.g. a negative count, throws naming the values; alloc checks plan rows with
     * {@code checkPlan}): alloc returns -1 for a request larger than the pool before it looks at {@code planRows}, so
     * alloc(more than the pool, planRows = -5) answers "no room" instead of refusing the negative row count.
     */
    @Test
    void allocWithANegativePlanRowCountAnswersNoRoom() {
        SlotAllocator a = allocator(1);
        assertThrows(IllegalArgumentException.class, () -> a.alloc(PAGES + 1, -5, 0));
    }
}
