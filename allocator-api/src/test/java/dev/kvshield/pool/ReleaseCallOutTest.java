package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import dev.kvshield.testing.TestXorSealer;
import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * A release's call out of the pool (the tenant's protection: a sealer's {@code canSeal}) runs before its first change
 * (design note 49). Attack round 18 wrote these against the batched release paths (86b60e8), where each failed; the
 * page-by-page code they replaced (0ab6f4f) passed the second and stranded one page in the first.
 *
 * <p>What held (differential fuzz of 80 seeded runs x 300 calls, old vs new, event log + {@code stateDigest} + snapshot +
 * owned counts + page bytes after every call: allocate/allocateRows over four tenants (NONE, ZERO with a quota, ENCRYPT,
 * COMPLIANCE), release and releaseHeldPages of random subsets in random order with foreign, stale, duplicate and
 * out-of-range entries, readers across a shared namespace, claims taken/dropped/fenced, transfers to NAMESPACE and
 * DEFERRED_FREE, shreds, boundaries, release lag 0/1, generations two below their last, a 12-lease table, with and
 * without listeners, synchronous and asynchronous quarantine): identical in every run except where an SPI callback
 * under the lock throws or attaches a listener (the tests below).
 */
class ReleaseCallOutTest {
    private static final long R1 = Owners.request(1);
    private static final long R2 = Owners.request(2);

    /** A test sealer whose {@code canSeal} can be made to throw, or to run an action (once) when first asked. */
    static final class HookedSealer extends TestXorSealer {
        volatile boolean failCanSeal;
        volatile Runnable onCanSeal;

        HookedSealer(dev.kvshield.memory.PageMemory memory) {
            super(memory);
        }

        @Override
        public boolean canSeal(int tenant) {
            Runnable hook = onCanSeal;
            if (hook != null) {
                onCanSeal = null;
                hook.run();
            }
            if (failCanSeal) {
                throw new IllegalStateException("key service unavailable");
            }
            return super.canSeal(tenant);
        }
    }

    private static TestPools encryptPool(HookedSealer[] sealerOut, boolean bare) {
        UnaryOperator<PoolConfig.Builder> config = c -> c.sealer((PageSealerFactory) ctx -> {
            sealerOut[0] = new HookedSealer(ctx.memory());
            return sealerOut[0];
        });
        return bare ? TestPools.bare(TestPools.tinyGeometry(8), ProtectionLevel.NONE, config, UnaryOperator.identity())
                : TestPools.create(TestPools.tinyGeometry(8), ProtectionLevel.NONE, config, UnaryOperator.identity());
    }

    /**
     * Promise: a failure in the middle of a batch never leaves a page the pool can neither hand out nor release; a call
     * that throws leaves every page either released (protected at a boundary) or still held by the leases that hold it
     * (README: "every hold on a page is a lease ... a page is reused only when no hold is left"; Holds javadoc: "checks
     * every presented lease ... before anything changes, then applies with no step that can fail").
     *
     * <p>What happens: a release of three pages (each its lease's only hold, one ENCRYPT tenant) whose sealer's {@code
     * canSeal} throws (a key service down). The new whole-page path drops all three leases first
     * ({@code LeaseTable.dropSoleHolds}) and only then asks for the tenant's protection, which throws: the three pages stay
     * OWNED with no hold at all, their leases dead. Nothing can release them again (every lease is refused as released),
     * they are never scrubbed or sealed (the tenant's plaintext stays in memory for good), they count against the
     * tenant's quota forever, and they are lost to the pool. The page-by-page code ({@code releaseBatch} at 0ab6f4f) asked
     * for the protection after the first page's move, so at most that one page was stranded (QUARANTINED) and the other
     * two kept live leases that a retry releases. (Neither is atomic; the new code widens the damage from one page to the
     * whole batch and turns it into OWNED pages with zero holds, a state the pool otherwise never has.)
     *
     * <p>Severity: medium (needs a PageSealer SPI whose canSeal can throw, e.g. one backed by a remote key service; the
     * result is permanent leaked pages holding plaintext and a quota leak).
     *
     * <p>Cause: allocator-api/src/main/java/dev/kvshield/pool/Holds.java:205-206 ({@code releasedWhole}: {@code
     * dropSoleHolds} before {@code pool.protectionOf(pageTenant).forRelease(pageTenant)}, the one step that calls out).
     */
    @Test
    void aThrowingCanSealMidReleaseLeavesNoPageOwnedWithoutAHold() {
        HookedSealer[] sealer = new HookedSealer[1];
        try (TestPools t = encryptPool(sealer, false); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int e = pool.tenants().register("e", TenantPolicy.withLevel(ProtectionLevel.ENCRYPT));
            long[] leases = new long[3];
            assertTrue(pool.allocate(e, R1, LeaseKind.OWNER, 3, leases, 0));
            int[] pages = new int[3];
            for (int i = 0; i < 3; i++) {
                pages[i] = pool.view().pageOf(leases[i]);
                PoolProbe.fillPage(t.memory, arena, pages[i], e, R1);
            }
            sealer[0].failCanSeal = true;
            assertThrows(IllegalStateException.class, () -> pool.release(e, R1, leases, 0, 3, ReleaseReason.FINISHED));
            sealer[0].failCanSeal = false;

            for (int i = 0; i < 3; i++) {
                if (pool.view().stateOf(pages[i]) == PageState.OWNED) {
                    assertTrue(pool.view().contentHolds(pages[i]) > 0, "page " + pages[i] + " is OWNED with no hold left: no lease can"
                            + " ever release it, it is never protected, and tenant e's bytes stay in it");
                    assertTrue(pool.view().isLive(leases[i]), "page " + pages[i] + " is still OWNED but its lease " + leases[i]
                            + " is dead");
                }
            }
        }
    }

    /**
     * Promise: audit events identical in content and order to the page-by-page code; per design note 49 "every per-page
     * emit sits behind one 'anyone listening?' read per batch ... none can be added without a callback under the lock".
     *
     * <p>What happens: a PageSealer callback (canSeal, called under the pool lock in the middle of a release, once per run
     * of one tenant's pages) is such a callback: when it attaches a listener (an audit trail attached lazily on first key
     * use), the page-by-page code delivered every RELEASE emitted after it; the hold-by-hold path now reads
     * {@code hasListeners()} once before the loop, so the new listener gets the batch's PROTECT_ISSUED events without the
     * RELEASE events they follow (an audit trail would show pages protected that it never saw released).
     *
     * <p>Severity: low (needs a sealer or memory backend that attaches a listener from its callback).
     *
     * <p>Cause: allocator-api/src/main/java/dev/kvshield/pool/Holds.java:228 ({@code boolean emitting =
     * events.hasListeners()} hoisted in {@code releaseHoldByHold}; {@code forRelease} at :252 calls the sealer after it).
     */
    @Test
    void aListenerAttachedByASealerCallbackMidReleaseSeesTheRestOfTheBatchsReleases() {
        HookedSealer[] sealer = new HookedSealer[1];
        try (TestPools t = encryptPool(sealer, true)) {
            KvPagePool pool = t.pool;
            int e = pool.tenants().register("e", TenantPolicy.withLevel(ProtectionLevel.ENCRYPT));
            long[] leases = new long[3];
            assertTrue(pool.allocate(e, R1, LeaseKind.OWNER, 3, leases, 0));
            // the first page also read by R2, so the release goes hold by hold
            long[] reader = new long[1];
            pool.share(e, R1, new long[] {leases[0]}, 0, 1, LeaseKind.READER, e, R2, reader, 0);
            List<String> seen = new ArrayList<>();
            PageEventListener recorder = (type, page, generation, tenant, owner, detail) -> seen.add(type + " " + page);
            sealer[0].onCanSeal = () -> pool.addListener(recorder);

            pool.release(e, R1, leases, 0, 3, ReleaseReason.FINISHED);

            int p3 = pool.view().leaseIds().page(leases[2]); // the lease is dead now; its id still names its page
            // page order: HOLD_DROPPED page 1, RELEASE page 2, canSeal (listener attached), RELEASE page 3, PROTECT_ISSUED 2 and 3
            assertTrue(seen.contains("RELEASE " + p3), "the listener attached mid-batch missed page " + p3 + "'s RELEASE but got "
                    + seen);
        }
    }
}
