package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * Holds that end while others keep the page: a holder's writer claims on a page it no longer holds
 * are fenced (a late transfer cannot overwrite what the cache now serves), and a failed page still
 * dirty after its boundary scrub is retired as a verify failure.
 */
class OrphanedClaimsTest {
    private static final long REQUEST = Owners.request(1);
    private static final long CACHE = Owners.namespace(0);

    /** A request's page with a transfer's writer claim goes to the cache; the late transfer then writes. Returns the page's bytes. */
    private static MemorySegment lateWriteAfterTheCacheTookThePage(TestPools t, Arena arena, boolean requestKeepsAHold) {
        KvPagePool pool = t.pool;
        int a = pool.tenants().register("a");
        long[] h = new long[1];
        assertTrue(pool.allocate(a, REQUEST, LeaseKind.OWNER, 1, h, 0));
        int page = pool.view().pageOf(h[0]);
        long claim = Leases.claim(pool, a, REQUEST, h[0], ClaimKind.WRITER, 77);
        int bytes = (int) pool.geometry().pageBytes(0);
        pool.write(a, REQUEST, h[0], 0, 0, Patterns.fill(arena, bytes, a, 1, page, 0));
        long[] cached = new long[1];
        if (requestKeepsAHold) {
            pool.share(a, REQUEST, h, 0, 1, LeaseKind.NAMESPACE, a, CACHE, cached, 0); // planted: the request keeps its hold
        } else {
            pool.transfer(a, REQUEST, h, 0, 1, LeaseKind.NAMESPACE, CACHE, cached, 0);
        }
        MemorySegment late = Patterns.fill(arena, bytes, a, 99, page, 0);
        try {
            pool.write(a, REQUEST, claim, 0, 0, late);
        } catch (FencedLeaseException e) {
            assertTrue(e.getMessage().contains("fenced"), e.getMessage());
        }
        assertEquals(PageState.OWNED, pool.view().stateOf(page), "the cache keeps the page");
        MemorySegment seen = arena.allocate(bytes);
        t.memory.read(page, 0, 0, seen);
        return seen;
    }

    @Test
    void aWriterClaimOfAHolderThatLetGoCannotOverwriteWhatTheCacheServes() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            MemorySegment seen = lateWriteAfterTheCacheTookThePage(t, arena, false);
            int page = 1;
            assertTrue(Patterns.matches(seen, 0, 1, page, 0), "the cached page still holds the request's KV");
            assertEquals(1, t.pool.snapshot().revokedClaims(), "the orphaned writer claim is fenced, not dropped");
        }
    }

    @Test
    void twinAHolderThatStillHoldsThePageMayWriteThroughItsClaim() {
        try (TestPools t = TestPools.create(3, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            MemorySegment seen = lateWriteAfterTheCacheTookThePage(t, arena, true);
            assertTrue(Patterns.matches(seen, 0, 99, 1, 0), "twin: with its hold kept, the late write lands (the oracle sees it)");
        }
    }

    /** A backend whose first scrub of a batch throws, and whose later scrubs leave page 1 non-zero ({@code stuck}). */
    private static List<Long> retireReasons(boolean stuck) {
        List<Long> reasons = new ArrayList<>();
        UnaryOperator<PageMemory> wrap = m -> new ForwardingPageMemory(m) {
            private int scrubs;

            @Override
            public void scrub(int[] pages, int offset, int count) {
                if (++scrubs == 2) { // 1 is the pool's start-up scrub
                    throw new IllegalStateException("injected scrub fault");
                }
                super.scrub(pages, offset, count);
                if (stuck && scrubs > 2) {
                    for (int i = offset; i < offset + count; i++) {
                        if (pages[i] == 1) {
                            m.write(1, 0, 0, MemorySegment.ofArray(new byte[] {1, 2, 3, 4, 5, 6, 7, 8}));
                        }
                    }
                }
            }
        };
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO,
                c -> c.listener((type, page, gen, tenant, owner, detail) -> {
                    if (type == PageEventType.RETIRE) {
                        reasons.add(detail);
                    }
                }), wrap); Arena arena = Arena.ofConfined()) {
            int a = t.pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(t.pool.allocate(a, REQUEST, LeaseKind.OWNER, 1, h, 0));
            t.pool.release(a, REQUEST, h, 0, 1, ReleaseReason.FINISHED);
            t.pool.endStep();
            assertEquals(PageState.RETIRED, t.pool.view().stateOf(1));
            assertFalse(stuck && Patterns.allZero(PoolProbe.rawPage(t.memory, arena, 1)), "the stuck byte is still there");
        }
        return reasons;
    }

    @Test
    void aFailedPageStillDirtyAfterItsBoundaryScrubRetiresAsAVerifyFailure() {
        assertEquals(List.of((long) RetireReason.VERIFY_FAILED.ordinal()), retireReasons(true));
        assertEquals(List.of((long) RetireReason.PROTECTION_FAILED.ordinal()), retireReasons(false),
                "twin: a clean boundary scrub retires it as the protection failure it was");
    }
}
