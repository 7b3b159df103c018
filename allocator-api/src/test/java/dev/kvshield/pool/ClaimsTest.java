package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.function.UnaryOperator;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Claims fence in-flight transfers: a claimed page is never handed out, and a fenced claim is dead. */
class ClaimsTest {
    private static TestPools pools(QuarantineMode mode) {
        return TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO, c -> c.quarantineMode(mode), UnaryOperator.identity());
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void releasedPageWithALiveWriterIsNeverHandedOutUntilTheClaimDrops(QuarantineMode mode) {
        try (TestPools t = pools(mode); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, h, 0));
            long claim = Leases.claim(pool, a, Owners.request(1), h[0], ClaimKind.WRITER, 42);
            pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.ABORTED);
            pool.endStep();
            assertEquals(1, pool.available(), "only the unclaimed page is available");
            PoolSnapshot s = pool.snapshot();
            assertEquals(1, s.awaitingClaims());
            assertEquals(1, s.claimedPages());
            long[] hb = new long[2];
            assertFalse(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 2, hb, 0), "pressure must not free a claimed page");
            assertTrue(pool.lastShortfall().contains("awaitingClaims=1"), pool.lastShortfall());
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
            assertEquals(pool.view().pageOf(h[1]), pool.view().pageOf(hb[0]));
            // The late transfer still lands: in the quarantined page, never in B's.
            int bytes = (int) pool.geometry().pageBytes(0);
            Leases.write(pool, claim, 0, 0, Patterns.fill(arena, bytes, a, 1, pool.view().pageOf(h[0]), 0));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(hb[0]))), "B's page untouched");
            for (int step = 0; step < 3; step++) {
                pool.endStep();
                assertEquals(PageState.QUARANTINED, pool.view().stateOf(pool.view().pageOf(h[0])), "no timeout frees a claimed page");
            }
            Leases.dropClaims(pool, new long[] {claim}, 0, 1);
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(pool.view().pageOf(h[0])));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(h[0]))), "late write scrubbed");
            assertTrue(pool.allocate(b, Owners.request(3), LeaseKind.OWNER, 1, hb, 1));
            assertEquals(pool.view().pageOf(h[0]), pool.view().pageOf(hb[1]));
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void aFencedClaimFailsEveryUseButKeepsThePageQuarantinedUntilDrained(QuarantineMode mode) {
        try (TestPools t = pools(mode); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            long claim = Leases.claim(pool, a, Owners.request(1), h[0], ClaimKind.READER, 7);
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            pool.write(a, Owners.request(1), h[0], 0, 0, token);
            Leases.fence(pool, claim);
            long digest = pool.stateDigest();
            FencedLeaseException e = assertThrows(FencedLeaseException.class, () -> Leases.write(pool, claim, 0, 0, token));
            assertTrue(e.getMessage().contains("fenced"), e.getMessage());
            assertThrows(FencedLeaseException.class, () -> Leases.read(pool, claim, 0, 0, token));
            assertEquals(digest, pool.stateDigest());
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.TIMEOUT);
            pool.endStep();
            assertEquals(1, pool.snapshot().revokedClaims());
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(1), "expiry is not a free");
            assertEquals(1, pool.available(), "page 2 only");
            Leases.dropClaims(pool, new long[] {claim}, 0, 1);
            assertThrows(ReleasedLeaseException.class, () -> pool.dropClaims(a, Owners.request(1), new long[] {claim}, 0, 1), "a dropped claim id is dead");
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(1));
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void batchDropQueuesEachTenantsPagesWithItsOwnLevel(QuarantineMode mode) {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(6), ProtectionLevel.ZERO, c -> c.quarantineMode(mode),
                UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int n = pool.tenants().register("n", dev.kvshield.tenant.TenantPolicy.withLevel(ProtectionLevel.NONE));
            long[] ha = new long[2];
            long[] hn = new long[2];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 2, ha, 0));
            assertTrue(pool.allocate(n, Owners.request(2), LeaseKind.OWNER, 2, hn, 0));
            for (long h : ha) {
                PoolProbe.fillPage(t.memory, arena, pool.view().pageOf(h), a, 1);
            }
            for (long h : hn) {
                PoolProbe.fillPage(t.memory, arena, pool.view().pageOf(h), n, 2);
            }
            long[] claims = new long[4];
            pool.claim(a, Owners.request(1), ha, 0, 2, ClaimKind.WRITER, 1, claims, 0);
            pool.claim(n, Owners.request(2), hn, 0, 2, ClaimKind.WRITER, 1, claims, 2);
            pool.release(a, Owners.request(1), ha, 0, 2, ReleaseReason.ABORTED);
            pool.release(n, Owners.request(2), hn, 0, 2, ReleaseReason.ABORTED);
            long digest = pool.stateDigest();
            assertThrows(dev.kvshield.lease.DuplicateLeaseException.class,
                    () -> Leases.dropClaims(pool, new long[] {claims[0], claims[0]}, 0, 2));
            assertEquals(digest, pool.stateDigest());
            Leases.dropClaims(pool, claims, 0, 2);
            Leases.dropClaims(pool, claims, 2, 2);
            pool.endStep();
            for (long h : ha) {
                assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(h))), "tenant a is ZERO");
            }
            for (long h : hn) {
                assertTrue(PoolProbe.holdsPattern(t.memory, arena, pool.view().pageOf(h), n, 2), "tenant n is NONE");
            }
        }
    }
}
