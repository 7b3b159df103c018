package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.constraints.IntRange;

/**
 * A release of a batch, by leases or by pages, is the release of its pages one by one, whichever way the pool takes it:
 * whole pages part by part (every page's only hold, one tenant) or hold by hold (some page also held by a reader or
 * claimed). Random batches of a holder's pages, some shared or claimed, against a page-by-page model: the same events in
 * the same order with the same values, the same states and generations, and the boundary hands the batch's free pages
 * out again in release order.
 */
class BatchReleaseProperties {
    private static final int PAGES = 24;
    private static final long OWNER = Owners.request(1);
    private static final long READER = Owners.request(2);

    @Property(tries = 300, seed = "20261207")
    void aBatchReleaseIsItsPagesReleasedOneByOne(@ForAll @IntRange(min = 1, max = PAGES - 1) int allocated, @ForAll long seed,
            @ForAll @IntRange(min = 0, max = 3) int shared, @ForAll @IntRange(min = 0, max = 2) int claimed,
            @ForAll boolean byPages) {
        try (TestPools t = TestPools.create(PAGES, ProtectionLevel.NONE)) {
            KvPagePool pool = t.pool;
            int tenant = pool.tenants().register("t");
            long[] leases = new long[allocated];
            assertTrue(pool.allocate(tenant, OWNER, LeaseKind.OWNER, allocated, leases, 0));
            List<Integer> picks = new ArrayList<>();
            for (int i = 0; i < allocated; i++) {
                picks.add(i);
            }
            Random random = new Random(seed);
            Collections.shuffle(picks, random);
            int n = 1 + random.nextInt(allocated);
            int[] pages = new int[n];
            long[] batch = new long[n];
            for (int i = 0; i < n; i++) {
                batch[i] = leases[picks.get(i)];
                pages[i] = pool.view().pageOf(batch[i]);
            }
            // the batch's first pages also held by a reader, the next ones claimed by the owner
            int readers = Math.min(shared, n);
            int claims = Math.min(claimed, n - readers);
            for (int i = 0; i < readers + claims; i++) {
                long[] one = {batch[i]};
                long[] out = new long[1];
                if (i < readers) {
                    pool.share(tenant, OWNER, one, 0, 1, LeaseKind.READER, tenant, READER, out, 0);
                } else {
                    pool.claim(tenant, OWNER, one, 0, 1, ClaimKind.READER, 7, out, 0);
                }
            }
            int[] generations = new int[n];
            for (int i = 0; i < n; i++) {
                generations[i] = pool.view().generationOf(pages[i]);
            }
            List<String> events = new ArrayList<>();
            pool.addListener(recorder(events));

            if (byPages) {
                long[] found = new long[n];
                assertTrue(pool.releaseHeldPages(tenant, OWNER, LeaseKind.OWNER, pages, 0, n, ReleaseReason.FINISHED, found, 0));
                assertArrayEquals(batch, found);
            } else {
                pool.release(tenant, OWNER, batch, 0, n, ReleaseReason.FINISHED);
            }

            List<String> expected = new ArrayList<>();
            List<Integer> protectedNow = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                if (i < readers) {
                    expected.add(event(PageEventType.HOLD_DROPPED, pages[i], generations[i], tenant, OWNER, LeaseKind.OWNER.ordinal()));
                    assertEquals(PageState.OWNED, pool.view().stateOf(pages[i]));
                    assertEquals(generations[i], pool.view().generationOf(pages[i]));
                } else {
                    expected.add(event(PageEventType.RELEASE, pages[i], generations[i] + 1, tenant, OWNER,
                            ReleaseReason.FINISHED.ordinal()));
                    assertEquals(PageState.QUARANTINED, pool.view().stateOf(pages[i]));
                    assertEquals(generations[i] + 1, pool.view().generationOf(pages[i]));
                    if (i >= readers + claims) {
                        protectedNow.add(i);
                    }
                }
            }
            for (int i : protectedNow) {
                expected.add(event(PageEventType.PROTECT_ISSUED, pages[i], generations[i] + 1, tenant, Owners.NOBODY,
                        ProtectionLevel.NONE.ordinal()));
            }
            assertEquals(expected, events);
            assertEquals(allocated - n + readers, pool.ownedBy(tenant));

            pool.endStep();
            long[] again = new long[protectedNow.size()];
            assertTrue(pool.allocate(tenant, Owners.request(3), LeaseKind.OWNER, again.length, again, 0));
            for (int k = 0; k < again.length; k++) {
                assertEquals(pages[protectedNow.get(k)], pool.view().pageOf(again[k]), "hand-out " + k + " after the boundary");
            }
        }
    }

    private static PageEventListener recorder(List<String> out) {
        return (type, page, generation, tenant, owner, detail) -> out.add(event(type, page, generation, tenant, owner, detail));
    }

    private static String event(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
        return type + " " + page + "@" + generation + " t" + tenant + " o" + owner + " d" + detail;
    }
}
