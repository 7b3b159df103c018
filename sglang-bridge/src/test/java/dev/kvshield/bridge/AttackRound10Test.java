package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.bridge.handoff.HandoffBridge;
import dev.kvshield.bridge.handoff.PrefillSends;
import dev.kvshield.bridge.prefix.PrefixCacheBridge;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Round ten of attacks on {@link SlotAllocator}, called directly as a hostile or buggy caller would. Each test fails on
 * the code it was written against because of the defect its javadoc names.
 */
class AttackRound10Test {
    private static final int PAGES = 17;

    private OffHeapPageMemory memory;
    private LongBuffer io;
    private LongBuffer plan;

    @AfterEach
    void close() {
        if (memory != null) {
            memory.close();
        }
    }

    private SlotAllocator allocator(int page) {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(page).pageCount(PAGES).build());
        ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * page * 8).order(ByteOrder.nativeOrder());
        ByteBuffer planBytes = ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
        io = ioBytes.asLongBuffer();
        plan = planBytes.asLongBuffer();
        SlotAllocator a = SlotAllocator.create(new HashMap<>(Map.of("advertisedContextTokens", "16")), memory.geometry(), memory);
        a.bind(ioBytes, planBytes);
        return a;
    }

    private void row(int r, long request, int tenant, long prefix, long seq, long lastLoc) {
        plan.put(r * SlotAllocator.PLAN_ROW, new long[] {request, tenant, prefix, seq, lastLoc});
    }

    /**
     * Rule (lead's decision on round 10 finding 1): unattributed holds are the default tenant's, the only tenant whose
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
     * Promise (brief / class contract: negative or overflowing counts throw naming the values): freeSegment checks
     * {@code startPos + count > slotCount} in long arithmetic that overflows, so startPos = Long.MAX_VALUE - 2, count = 3
     * passes the check and the call returns -1 ("free by slots instead") instead of throwing.
     */
    @Test
    void freeSegmentWithAnOverflowingSegmentDoesNotThrow() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        assertThrows(IllegalArgumentException.class, () -> a.freeSegment(5, Long.MAX_VALUE - 2, 3, t, 0));
    }

    /**
     * Promise (adoptIntoCache javadoc: "{@code toPos} -1: every position from fromPos"; IAE "needs ... 0 <= from <= to
     * (or to = -1)"): any negative toPos (here -5, e.g. a caller's unset or wrapped value) is taken as "every position",
     * so the request's whole page list from fromPos moves to the ENGINE_CACHE namespace, where only a CACHE_EVICTION free
     * can release it, instead of the call throwing with nothing changed.
     */
    @Test
    void adoptIntoCacheTakesANegativeToPosAsEveryPosition() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        long digest = a.pool().stateDigest();
        assertThrows(IllegalArgumentException.class, () -> a.adoptIntoCache(5, t, 0, -5, 0));
        assertEquals(2, a.heldPages(5));
        assertEquals(digest, a.pool().stateDigest());
    }

    /**
     * Promise (endRequestFrees/releaseRequest: a request's id is >= 0, releaseRequest refuses "a request id >= 0"; class
     * javadoc IN_FREE_GROUP: pages freed inside SGLang's free group "are released together at endFreeGroup"):
     * {@code endRequestFrees} does not check the request id; {@code holderOf(-3)} maps every negative id to UNATTRIBUTED,
     * so {@code endRequestFrees(-3, defaultTenant)} releases the engine's unattributed frees deferred inside the open free
     * group before {@code endFreeGroup}.
     */
    @Test
    void endRequestFreesWithANegativeIdReleasesTheOpenFreeGroup() {
        SlotAllocator a = allocator(1);
        assertEquals(4, a.alloc(4, 0, 0)); // no plan: unattributed
        assertEquals(0, a.free(4, a.defaultTenant(), -1, SlotAllocator.IN_FREE_GROUP));
        assertEquals(4, a.pendingGroupPages());
        long digest = a.pool().stateDigest();
        assertThrows(IllegalArgumentException.class, () -> a.endRequestFrees(-3, a.defaultTenant(), 0));
        assertEquals(4, a.pendingGroupPages(), "the free group's pages were released before endFreeGroup");
        assertEquals(digest, a.pool().stateDigest());
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
     * Rule (round 10 finding 21): a request id belongs to one tenant, the tenant of the pages it holds here. A plan row
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

    /** A decode-side reservation of 8 tokens (2 pages) committed for {@code request} of the default tenant; null when refused. */
    private static int[] reserveAndCommit(SlotAllocator a, HandoffBridge d, long request) {
        d.handshake(3, d.effectiveLimitTokens());
        int[] pages = new int[PAGES];
        try {
            assertEquals(2, d.reserve(request, a.defaultTenant(), 8, 3, pages));
        } catch (IllegalArgumentException refused) {
            return null; // the fixed behaviour: a reserved id refused before anything was reserved
        }
        d.recordWritten(request, 0, 0, 4);
        d.recordWritten(request, 1, 0, 4);
        assertEquals(true, d.commit(request, 8).committed());
        return pages;
    }

    /**
     * Promise (brief: request ids in the reserved range are refused; SlotAllocator: "Request ids at or above this one
     * are the pool's own holders, never a request's", UNATTRIBUTED = request (2^62 - 1)): {@code HandoffBridge.reserve}
     * only checks [0, 2^62), so a handoff request with id 2^62 - 1 gets its pages as holds of the UNATTRIBUTED holder.
     * After its commit the engine's plain unattributed free (request -1, no CACHE_EVICTION), which must never release a
     * request's page (DESIGN-NOTES 20), releases the handed-off request's pages.
     */
    @Test
    void handoffRequestWithTheUnattributedIdIsFreedByAnUnattributedFree() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            long id = (1L << 62) - 1;
            int[] pages = reserveAndCommit(a, d, id);
            if (pages == null) {
                return;
            }
            long[] slots = new long[8];
            for (int i = 0; i < 8; i++) {
                slots[i] = (long) pages[i / 4] * 4 + i % 4;
            }
            io.put(0, slots);
            assertEquals(2, a.free(8, a.defaultTenant(), -1, 0),
                    "an unattributed free released the pages of handoff request " + id);
        }
    }

    /**
     * Promise (releaseAll javadoc: SGLang's {@code clear()} "releases every page a request, the prefix cache or the
     * unattributed holder holds"; brief: fail closed, nothing half-applied): after a handoff reservation under the
     * reserved id 2^62 - 2 (accepted by {@code HandoffBridge.reserve}, see above) joined the page lists, every
     * {@code releaseAll} throws from {@code holderOf} ("one of the pool's own holders") after it has already ended the
     * free group: SGLang's clear crashes and nothing of the pool is released.
     */
    @Test
    void handoffRequestWithAReservedIdMakesClearThrow() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            int[] pages = reserveAndCommit(a, d, (1L << 62) - 2);
            if (pages == null) {
                return;
            }
            assertEquals(4, a.alloc(4, 0, 0));
            a.releaseAll();
            assertEquals(PAGES - 1 - 2, a.availablePages());
        }
    }

    /**
     * Promise (PrefixCacheBridge class javadoc: "Every call checks all its pages before changing anything and fails with
     * an exception naming the offending value"; settle: "positions [toPage, releaseToPage) ... are released where the
     * request still holds them"; SlotAllocator.releaseAll: clear() releases every page a request holds): settle with a
     * wrong tenant for the tail (here the whole range is tail) releases nothing, because the tenant does not hold the
     * pages, but still calls {@code forgetPage} on every page it walked. Request 7 of alpha keeps its three owner holds
     * while the allocator's page list forgets them: its releaseLeftovers then releases nothing and even releaseAll (whose
     * lookup goes through the page lists) leaves the three pages held forever.
     */
    @Test
    void settleWithTheWrongTenantDropsAnotherTenantsPagesFromTheBooks() {
        SlotAllocator a = allocator(4);
        int alpha = a.tenantId("alpha");
        int bravo = a.tenantId("bravo");
        PrefixCacheBridge cache = new PrefixCacheBridge(a);
        long before = a.availablePages();
        row(0, 7, alpha, 0, 12, -1);
        assertEquals(12, a.allocExtend(1, 12, 0));
        try {
            cache.settle(7, bravo, 0, 0, 3, new byte[0], new int[0]);
        } catch (IllegalArgumentException refused) {
            // fine: refused naming the value
        }
        int listed = a.heldPages(7);
        a.releaseAll();
        assertEquals(before, a.availablePages(), "pages leaked through clear() (request 7's list now names " + listed + " pages)");
        assertEquals(3, listed, "alpha's request 7 lost its page list to bravo's settle");
    }

    /**
     * Promise (recordRequestPages javadoc: "Lists pages a request holds through another path"; releaseAll: clear()
     * "releases every page a request ... holds through this allocator"; brief: bad input fails closed): recordRequestPages
     * takes any page for any request without asking the pool whether that request holds it. Listing request 7's page
     * under request 9 unlinks it from request 7's list: request 7's releaseLeftovers no longer finds it, request 9's cannot
     * release it (not its hold), and releaseAll (which looks holds up through the lists) leaves it held for good.
     */
    @Test
    void recordRequestPagesOfAPageAnotherRequestHoldsLeaksIt() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        long before = a.availablePages();
        row(0, 7, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        int page = a.pageAt(7, 1);
        try {
            a.recordRequestPages(9, new int[] {page}, 1, 0);
        } catch (RuntimeException refused) {
            // fine: request 9 does not hold it
        }
        int leftovers = a.releaseLeftovers(7, t, 0);
        a.releaseAll();
        assertEquals(before, a.availablePages(), "page " + page + " leaked through clear()");
        assertEquals(2, leftovers, "request 7's leftovers missed the page relisted under request 9");
    }

    /**
     * Promise (brief: bad input throws naming the values and leaves everything as it was, nothing half-applied):
     * recordRequestPages with a page id outside the pool in its second entry links the first entry, then fails with a bare
     * ArrayIndexOutOfBoundsException (no value named by the allocator): page 3 is left listed under request 9.
     */
    @Test
    void recordRequestPagesWithAnOutOfRangePageIsHalfApplied() {
        SlotAllocator a = allocator(4);
        int t = a.tenantId("acme");
        row(0, 7, t, 0, 8, -1);
        assertEquals(8, a.allocExtend(1, 8, 0));
        int page = a.pageAt(7, 0);
        RuntimeException e = assertThrows(RuntimeException.class, () -> a.recordRequestPages(9, new int[] {page, 999}, 2, 0));
        assertEquals(7, a.requestOf(page), "the first entry was applied before the failure (" + e + ")");
        assertEquals(IllegalArgumentException.class, e.getClass(), "not refused by a check: " + e);
    }

    /**
     * Rule (lead's decision on round 10 finding 19): the step boundary rides on the step's first crossing (the caller has
     * consumed its flag), so it belongs to the step, not to the call: it runs exactly once even when the call's own
     * arguments are then refused, and the refused operation changes nothing else. The pool after the refused free equals
     * the pool of a twin allocator that ran the same calls and one explicit endStep.
     */
    @Test
    void aRejectedCallHasAlreadyRunItsStepBoundary() {
        int quarantinedMask = 1 << dev.kvshield.lifecycle.PageState.QUARANTINED.ordinal();
        int[] out = new int[PAGES];
        long expected;
        try (OffHeapPageMemory twinMemory = OffHeapPageMemory.allocate(
                PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(1).pageCount(PAGES).build())) {
            SlotAllocator twin = SlotAllocator.create(new HashMap<>(Map.of("advertisedContextTokens", "16")),
                    twinMemory.geometry(), twinMemory);
            twin.bind(ByteBuffer.allocateDirect(PAGES * 8).order(ByteOrder.nativeOrder()),
                    ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder()));
            assertEquals(4, twin.alloc(4, 0, 0));
            assertEquals(0, twin.free(4, twin.defaultTenant(), -1, 0));
            twin.endStep();
            expected = twin.pool().stateDigest();
            twin.close();
        }
        SlotAllocator a = allocator(1);
        assertEquals(4, a.alloc(4, 0, 0));
        assertEquals(0, a.free(4, a.defaultTenant(), -1, 0));
        assertEquals(4, a.pagesIn(quarantinedMask, out));
        io.put(0, 99_999);
        assertThrows(IllegalArgumentException.class, () -> a.free(1, a.defaultTenant(), -1, SlotAllocator.STEP_BOUNDARY));
        assertEquals(0, a.pagesIn(quarantinedMask, out), "the step's boundary did not run");
        assertEquals(expected, a.pool().stateDigest(), "the refused free changed more than its step's boundary");
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

    /**
     * Promise (brief: bad input, here a pagesOut array too short for the request, throws and leaves the pool exactly as it
     * was; HandoffBridge.reserve javadoc lists its refusals as "before anything is reserved"): reserve reserves the pages
     * first and only then checks {@code pagesOut}; the undo (abort + acknowledge) leaves the two pages QUARANTINED
     * instead of FREE, with a reservation and an abort in their history, so the pool's state differs after the throw.
     */
    @Test
    void handoffReserveWithAShortPagesOutChangesThePoolBeforeThrowing() {
        SlotAllocator a = allocator(4);
        try (HandoffBridge d = new HandoffBridge(a)) {
            int t = a.tenantId("acme");
            d.handshake(3, d.effectiveLimitTokens());
            long digest = a.pool().stateDigest();
            assertThrows(IllegalArgumentException.class, () -> d.reserve(5, t, 8, 3, new int[1]));
            int[] out = new int[PAGES];
            assertEquals(0, a.pagesIn(1 << dev.kvshield.lifecycle.PageState.QUARANTINED.ordinal(), out),
                    "pages reserved and aborted by a call refused for its argument");
            assertEquals(digest, a.pool().stateDigest());
        }
    }

    /**
     * Promise (brief: an unknown tenant id throws naming it, nothing recorded; HandoffBridge.reserve and the
     * SlotAllocator calls refuse unregistered tenants): PrefillSends.begin records a send for tenant 99, which was never
     * registered; only the first claim then fails (as a ForeignAccessException, not as an unknown tenant).
     */
    @Test
    void prefillSendBeginAcceptsAnUnregisteredTenant() {
        SlotAllocator a = allocator(4);
        PrefillSends sends = new PrefillSends(a);
        try {
            sends.begin(2, 99, 8, 3);
        } catch (RuntimeException refused) {
            assertEquals(false, sends.has(2));
            return;
        }
        assertEquals(false, sends.has(2), "a send was recorded for unregistered tenant 99");
    }

    /**
     * Promise (brief: bad input fails closed and leaves nothing behind; SlotAllocator constructor: a metrics endpoint it
     * cannot start closes the pool before throwing): the default tenant is registered last, after the pool was created
     * and the loopback metrics endpoint started, with nothing to undo them when the name is refused. A server whose
     * {@code defaultTenant} setting is ill-formed (here blank) gets the IllegalArgumentException, but the metrics port
     * stays bound (and the pool's protection worker stays up), so the corrected retry on the same port fails.
     */
    @Test
    void aRefusedDefaultTenantNameLeavesTheMetricsPortBound() throws java.io.IOException {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(1).pageCount(PAGES).build());
        int port;
        try (java.net.ServerSocket probe = new java.net.ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            port = probe.getLocalPort(); // a port free now
        }
        assertThrows(IllegalArgumentException.class, () -> SlotAllocator.create(
                Map.of("advertisedContextTokens", "16", "metricsBasePort", Integer.toString(port), "defaultTenant", " "),
                memory.geometry(), memory));
        try (SlotAllocator retry = SlotAllocator.create(Map.of("advertisedContextTokens", "16", "metricsBasePort",
                Integer.toString(port)), memory.geometry(), memory)) {
            assertEquals(port, retry.metricsPort());
        }
    }

    /**
     * Promise (brief: fail closed, loudly; SlotAllocator.close: "Stops ... the pool's protection worker; closes the memory
     * if open built it"): nothing checks that the allocator is still open. After close() (memory closed by open()), alloc
     * still hands out four slots over the closed memory, and the free of them "succeeds" (the pool's protection then fails
     * in the background and retires the pages, logged only), instead of an IllegalStateException.
     */
    @Test
    void aClosedAllocatorStillAllocates() {
        SlotAllocator a = SlotAllocator.open(Map.of("backend", "cpu-offheap", "advertisedContextTokens", "16"), 1, PAGES,
                new String[] {"K", "V"}, new String[] {"k", "v"}, new int[] {64, 64}, new long[] {0, 0}, new long[] {0, 0}, -1, 0,
                new long[0]);
        a.bind(ByteBuffer.allocateDirect(PAGES * 8).order(ByteOrder.nativeOrder()),
                ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder()));
        a.close();
        assertThrows(IllegalStateException.class, () -> a.alloc(4, 0, 0));
    }

    /**
     * Ambiguous promise (class javadoc, IN_FREE_GROUP: inside SGLang's free group "the pages become deferred frees of the
     * request ... and are released together at endFreeGroup"; README: "Inside SGLang's free group the freed pages stay
     * held until free_group_end"): the group's deferred frees and a request release's deferred frees share one list keyed
     * by (tenant, holder), so a request's releaseRequest while SGLang's group is open releases (through endRequestFrees)
     * the page the request freed in the group earlier, before endFreeGroup. (endRequestFrees' javadoc says SGLang's open
     * group "ends with endFreeGroup instead"; releaseRequest, which calls it, has no such caveat and no way to tell.)
     */
    @Test
    void releaseRequestReleasesThePagesTheRequestFreedInsideAnOpenFreeGroup() {
        SlotAllocator a = allocator(1);
        int t = a.tenantId("acme");
        row(0, 5, t, 0, 4, -1);
        assertEquals(4, a.alloc(4, 1, 0));
        long[] slots = new long[4];
        io.get(0, slots);
        io.put(0, slots[0]);
        assertEquals(0, a.free(1, t, 5, SlotAllocator.IN_FREE_GROUP)); // SGLang's free group is open
        assertEquals(1, a.pendingGroupPages());
        io.put(0, slots[1]);
        assertEquals(0, a.releaseRequest(1, t, 5, true, 0)); // the request's release, still inside the group
        assertEquals(1, a.pendingGroupPages(), "the page freed inside SGLang's group was released before free_group_end");
    }

    /**
     * Promise (PrefixCacheBridge class javadoc: "Every call checks all its pages before changing anything and fails with
     * an exception naming the offending value"; brief: nothing half-applied): reclaim checks neither {@code pagesOut}'s
     * length nor anything else before {@code pool.reclaim}. With a pagesOut one entry short, both sealed references are
     * reclaimed into the cache namespace (two pages OWNED, availability down by two, the references consumed: a second
     * reclaim gets 0), then an ArrayIndexOutOfBoundsException: the caller never learns the second page's id, so its tree
     * cannot evict it, and the page is held for good.
     */
    @Test
    void prefixReclaimWithAShortPagesOutReclaimsThenThrows() {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(4).pageCount(PAGES).build());
        try (SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "level", "ENCRYPT", "sealerFactory",
                XorTestSealerFactory.class.getName()), memory.geometry(), memory)) {
            SlotAllocators.bind(a);
            int t = a.tenantId("acme");
            PrefixCacheBridge cache = new PrefixCacheBridge(a);
            SlotAllocators.allocate(a, 9, t, 8);
            int[] taken = new int[2];
            assertEquals(2, cache.settle(9, t, 0, 2, 2, new byte[] {1, 1}, taken));
            long[] sealed = new long[2];
            assertEquals(2, cache.evict(taken, 2, sealed));
            a.endStep();
            long available = a.availablePages();
            long digest = a.pool().stateDigest();
            RuntimeException e = assertThrows(RuntimeException.class, () -> cache.reclaim(t, sealed, 2, new int[1]));
            assertEquals(available, a.availablePages(), "reclaimed before failing with " + e);
            assertEquals(digest, a.pool().stateDigest());
            assertEquals(IllegalArgumentException.class, e.getClass());
        }
    }
}
