package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.claims.ClaimRevokedException;
import dev.kvshield.claims.UnknownClaimException;
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
            assertTrue(pool.allocate(a, Owners.request(1), 2, h, 0));
            long claim = pool.claim(a, Owners.request(1), h[0], ClaimKind.WRITER, 42);
            pool.release(a, Owners.request(1), h, 0, 2, ReleaseReason.ABORTED);
            pool.endStep();
            assertEquals(1, pool.available(), "only the unclaimed page is available");
            PoolSnapshot s = pool.snapshot();
            assertEquals(1, s.awaitingClaims());
            assertEquals(1, s.claimedPages());
            long[] hb = new long[2];
            assertFalse(pool.allocate(b, Owners.request(2), 2, hb, 0), "pressure must not free a claimed page");
            assertTrue(pool.lastShortfall().contains("awaitingClaims=1"), pool.lastShortfall());
            assertTrue(pool.allocate(b, Owners.request(2), 1, hb, 0));
            assertEquals(PageHandles.page(h[1]), PageHandles.page(hb[0]));
            // The late transfer still lands: in the quarantined page, never in B's.
            int bytes = (int) pool.geometry().pageBytes(0);
            pool.writeClaimed(claim, 0, 0, Patterns.fill(arena, bytes, a, 1, PageHandles.page(h[0]), 0));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, PageHandles.page(hb[0]))), "B's page untouched");
            for (int step = 0; step < 3; step++) {
                pool.endStep();
                assertEquals(PageState.QUARANTINED, pool.stateOf(PageHandles.page(h[0])), "no timeout frees a claimed page");
            }
            pool.dropClaim(claim);
            pool.endStep();
            assertEquals(PageState.FREE, pool.stateOf(PageHandles.page(h[0])));
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, PageHandles.page(h[0]))), "late write scrubbed");
            assertTrue(pool.allocate(b, Owners.request(3), 1, hb, 1));
            assertEquals(PageHandles.page(h[0]), PageHandles.page(hb[1]));
        }
    }

    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void aFencedClaimFailsEveryUseButKeepsThePageQuarantinedUntilDrained(QuarantineMode mode) {
        try (TestPools t = pools(mode); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), 1, h, 0));
            long claim = pool.claim(a, Owners.request(1), h[0], ClaimKind.READER, 7);
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            pool.write(a, Owners.request(1), h[0], 0, 0, token);
            pool.fenceClaim(claim);
            long digest = pool.stateDigest();
            ClaimRevokedException e = assertThrows(ClaimRevokedException.class, () -> pool.writeClaimed(claim, 0, 0, token));
            assertTrue(e.getMessage().contains("fenced"), e.getMessage());
            assertThrows(ClaimRevokedException.class, () -> pool.readClaimed(claim, 0, 0, token));
            assertEquals(digest, pool.stateDigest());
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.TIMEOUT);
            pool.endStep();
            assertEquals(1, pool.snapshot().revokedClaims());
            assertEquals(PageState.QUARANTINED, pool.stateOf(1), "expiry is not a free");
            assertEquals(1, pool.available(), "page 2 only");
            pool.dropClaim(claim);
            assertThrows(UnknownClaimException.class, () -> pool.dropClaim(claim), "a dropped claim id is dead");
            pool.endStep();
            assertEquals(PageState.FREE, pool.stateOf(1));
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
            assertTrue(pool.allocate(a, Owners.request(1), 2, ha, 0));
            assertTrue(pool.allocate(n, Owners.request(2), 2, hn, 0));
            for (long h : ha) {
                PoolProbe.fillPage(t.memory, arena, PageHandles.page(h), a, 1);
            }
            for (long h : hn) {
                PoolProbe.fillPage(t.memory, arena, PageHandles.page(h), n, 2);
            }
            long[] claims = new long[4];
            pool.claimAll(a, Owners.request(1), ha, 0, 2, ClaimKind.WRITER, 1, claims, 0);
            pool.claimAll(n, Owners.request(2), hn, 0, 2, ClaimKind.WRITER, 1, claims, 2);
            pool.release(a, Owners.request(1), ha, 0, 2, ReleaseReason.ABORTED);
            pool.release(n, Owners.request(2), hn, 0, 2, ReleaseReason.ABORTED);
            long digest = pool.stateDigest();
            assertThrows(UnknownClaimException.class, () -> pool.dropClaims(new long[] {claims[0], claims[0]}, 0, 2));
            assertEquals(digest, pool.stateDigest());
            pool.dropClaims(claims, 0, 4);
            pool.endStep();
            for (long h : ha) {
                assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, PageHandles.page(h))), "tenant a is ZERO");
            }
            for (long h : hn) {
                assertTrue(PoolProbe.holdsPattern(t.memory, arena, PageHandles.page(h), n, 2), "tenant n is NONE");
            }
        }
    }
}
