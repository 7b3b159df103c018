package dev.kvshield.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.StaleLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.EpochSealer;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.PageRecords;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.HashSet;
import java.util.Set;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;

/**
 * Attacks on holds beyond the known defect classes: colliding ids, other tenants' holds on a shared
 * namespace, regulated tenants, readers that outlive the namespace hold, claims whose page loses
 * its last hold mid-transfer, reclaims under quota, transfers onto a holder that already holds the
 * page, empty and full batches, and a "none" answer that must leave the pool as it was.
 */
class HoldsAttackTest {
    static final long R1 = Owners.request(1);
    static final long R2 = Owners.request(2);
    static final long R3 = Owners.request(3);
    static final long NS = Owners.namespace(0);

    static TestPools encrypt(int pages, UnaryOperator<PageMemory> memory) {
        return TestPools.create(TestPools.tinyGeometry(pages), ProtectionLevel.ENCRYPT, c -> c.sealer(ctx -> new EpochSealer(ctx.memory())),
                memory);
    }

    static boolean reads(KvPagePool pool, Arena arena, int tenant, long holder, long lease, int patternTenant, long patternRequest) {
        MemorySegment got = arena.allocate(pool.geometry().pageBytes(0));
        pool.read(tenant, holder, lease, 0, 0, got);
        return Patterns.matches(got, patternTenant, patternRequest, pool.view().pageOf(lease), 0);
    }

    // ------------------------------------------------------------ colliding ids

    /**
     * Two pools of one geometry fed the same calls mint the same ids (tensor-parallel ranks must
     * decide alike), so a lease id is not unique across pools: what keeps a lease of pool A from
     * acting in pool B is the binding to its holder. In B it acts as the presenting holder's own
     * hold, or not at all.
     */
    @Test
    void aLeaseOfAnotherPoolActsOnlyAsThePresentersOwnHoldOrNotAtAll() {
        PoolGeometry g = TestPools.tinyGeometry(6);
        try (TestPools pa = TestPools.create(g, ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity());
                TestPools pb = TestPools.create(g, ProtectionLevel.ZERO, UnaryOperator.identity(), UnaryOperator.identity());
                Arena arena = Arena.ofConfined()) {
            int a = pa.pool.tenants().register("a");
            int b = pb.pool.tenants().register("b");
            assertEquals(a, b, "tenant ids are dense per pool: tenant 0 is a in A and b in B");
            long[] inA = Leases.allocateWritten(pa.pool, arena, a, R1, 1, 1);
            long[] inB = Leases.allocateWritten(pb.pool, arena, b, R2, 1, 2);
            assertEquals(inA[0], inB[0], "the same calls mint the same id in both pools");
            long digest = pb.pool.stateDigest();
            ForeignLeaseException e = assertThrows(ForeignLeaseException.class,
                    () -> pb.pool.write(a, R1, inA[0], 0, 0, Patterns.fill(arena, g.pageBytes(0), a, 1, 1, 0)));
            assertTrue(e.getMessage().contains("held by tenant 0 request 2, not by tenant 0 request 1"), e.getMessage());
            assertThrows(ForeignLeaseException.class, () -> pb.pool.release(a, R1, inA, 0, 1, ReleaseReason.FINISHED));
            assertEquals(digest, pb.pool.stateDigest());
            assertTrue(PoolProbe.holdsPattern(pb.memory, arena, pb.pool.view().pageOf(inB[0]), b, 2), "B's tenant keeps its bytes");
            // After different histories, A's id names nothing B minted.
            long[] more = new long[2];
            assertTrue(pa.pool.allocate(a, R1, LeaseKind.OWNER, 2, more, 0));
            assertFalse(pb.pool.view().isLive(more[1]));
            assertThrows(dev.kvshield.lease.UnknownLeaseException.class, () -> pb.pool.release(a, R1, more, 1, 1, ReleaseReason.FINISHED));
        }
    }

    @Test
    void idsAcrossPagesNeverCollideAndEachNamesItsPageForLife() {
        try (TestPools t = TestPools.create(9, ProtectionLevel.NONE)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            LeaseIds ids = pool.view().leaseIds();
            Set<Long> seen = new HashSet<>();
            Set<Long> serials = new HashSet<>();
            long[] h = new long[8];
            for (int round = 0; round < 200; round++) {
                assertTrue(pool.allocate(a, Owners.request(round), LeaseKind.OWNER, 8, h, 0));
                long[] readers = new long[8];
                pool.share(a, Owners.request(round), h, 0, 8, LeaseKind.READER, a, Owners.request(round + 1_000), readers, 0);
                for (long[] batch : new long[][] {h, readers}) {
                    for (long id : batch) {
                        assertTrue(seen.add(id), "id " + id + " minted twice");
                        assertTrue(serials.add(ids.serial(id)), "serial " + ids.serial(id) + " used on two pages");
                    }
                }
                for (int i = 0; i < 8; i++) {
                    assertEquals(pool.view().pageOf(h[i]), pool.view().pageOf(readers[i]));
                }
                pool.release(a, Owners.request(round + 1_000), readers, 0, 8, ReleaseReason.FINISHED);
                pool.release(a, Owners.request(round), h, 0, 8, ReleaseReason.FINISHED);
                for (int i = 0; i < 8; i++) {
                    assertFalse(pool.view().isLive(h[i]));
                    assertEquals(PageHandles.NONE, pool.view().handleOf(h[i]), "a dead lease has no handle");
                }
                pool.endStep();
            }
        }
    }

    // ------------------------------------------------------------ shared namespaces, regulated tenants, readers

    /**
     * Tenant b reads a page of the shared namespace pub. b's reader can read and nothing else: it
     * cannot write, share, claim, hand over or end pub's hold. pub's namespace hold ends while b
     * still reads: the page stays pub's (quota and protection), b still reads the exact bytes; when
     * b's read ends the page is sealed for pub, never for b.
     */
    @Test
    void anotherTenantsReaderOutlivesTheSharedNamespacesHoldAndTheSealStaysTheNamespaces() {
        try (TestPools t = encrypt(5, UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int pub = pool.tenants().register("pub");
            int b = pool.tenants().register("b");
            pool.declareSharedNamespace(pub);
            long[] owner = Leases.allocateWritten(pool, arena, pub, R1, 1, 1);
            long[] ns = new long[1];
            pool.transfer(pub, R1, owner, 0, 1, LeaseKind.NAMESPACE, NS, ns, 0);
            long handle = pool.view().handleOf(ns[0]);
            long reader = Leases.addReader(pool, pub, NS, ns[0], b, R2);
            int page = pool.view().pageOf(reader);
            long digest = pool.stateDigest();
            MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            assertThrows(ForeignLeaseException.class, () -> pool.write(b, R2, reader, 0, 0, token), "a reader may not write");
            assertThrows(ForeignLeaseException.class,
                    () -> pool.share(b, R2, new long[] {reader}, 0, 1, LeaseKind.READER, b, R3, new long[1], 0), "a reader may not share");
            assertThrows(ForeignLeaseException.class,
                    () -> pool.claim(b, R2, new long[] {reader}, 0, 1, ClaimKind.WRITER, 4, new long[1], 0), "a reader may not claim");
            assertThrows(ForeignLeaseException.class,
                    () -> pool.transfer(b, R2, new long[] {reader}, 0, 1, LeaseKind.OWNER, R3, new long[1], 0), "a reader may not hand over");
            assertThrows(ForeignLeaseException.class,
                    () -> pool.transfer(b, NS, ns, 0, 1, LeaseKind.NAMESPACE, Owners.namespace(1), new long[1], 0), "b may not take pub's hold");
            assertThrows(ForeignLeaseException.class, () -> pool.release(b, R2, ns, 0, 1, ReleaseReason.FINISHED));
            assertThrows(ForeignLeaseException.class, () -> pool.release(b, NS, ns, 0, 1, ReleaseReason.FINISHED));
            assertEquals(digest, pool.stateDigest());
            pool.release(pub, NS, ns, 0, 1, ReleaseReason.EVICTED);
            pool.endStep();
            assertEquals(PageState.OWNED, pool.view().stateOf(page), "b's read keeps the page");
            assertEquals(pub, pool.view().tenantOf(page));
            assertEquals(1, pool.ownedBy(pub), "the page counts against pub's quota, not b's");
            assertEquals(0, pool.ownedBy(b));
            assertTrue(reads(pool, arena, b, R2, reader, pub, 1), "b still reads pub's exact bytes");
            pool.release(b, R2, new long[] {reader}, 0, 1, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(PageState.SEALED, pool.view().stateOf(page));
            assertEquals(pub, pool.view().sealedFor(page), "sealed under pub's key, whoever held it last");
            assertFalse(PoolProbe.holdsPattern(t.memory, arena, page, pub, 1));
            long ref = PageHandles.sealedReference(handle);
            long[] back = new long[1];
            assertEquals(0, pool.reclaim(b, R2, LeaseKind.OWNER, new long[] {ref}, 0, 1, back, 0), "b can never reclaim pub's page");
            assertEquals(1, pool.reclaim(pub, NS, LeaseKind.NAMESPACE, new long[] {ref}, 0, 1, back, 0));
            assertTrue(PoolProbe.holdsPattern(t.memory, arena, page, pub, 1));
        }
    }

    @Test
    void aRegulatedTenantNeitherReadsASharedNamespaceNorLendsItsPagesToAnyone() {
        try (TestPools t = TestPools.create(5, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int pub = pool.tenants().register("pub");
            int bank = pool.tenants().register("bank", TenantPolicy.regulatedTenant());
            int c = pool.tenants().register("c");
            pool.declareSharedNamespace(pub);
            assertThrows(IllegalArgumentException.class, () -> pool.declareSharedNamespace(bank));
            long[] shared = Leases.allocateWritten(pool, arena, pub, R1, 1, 1);
            long[] own = Leases.allocateWritten(pool, arena, bank, R2, 1, 2);
            long digest = pool.stateDigest();
            ForeignAccessException e = assertThrows(ForeignAccessException.class,
                    () -> pool.share(pub, R1, shared, 0, 1, LeaseKind.READER, bank, R3, new long[1], 0));
            assertTrue(e.getMessage().contains("only non-regulated readers"), e.getMessage());
            for (LeaseKind kind : new LeaseKind[] {LeaseKind.READER, LeaseKind.OWNER, LeaseKind.RESERVATION, LeaseKind.DEFERRED_FREE}) {
                assertThrows(ForeignAccessException.class, () -> pool.share(bank, R2, own, 0, 1, kind, c, R3, new long[1], 0), kind.name());
                assertThrows(ForeignAccessException.class, () -> pool.share(bank, R2, own, 0, 1, kind, pub, R3, new long[1], 0), kind.name());
            }
            assertThrows(ForeignAccessException.class, () -> pool.share(bank, R2, own, 0, 1, LeaseKind.NAMESPACE, c, NS, new long[1], 0));
            assertEquals(digest, pool.stateDigest());
            assertEquals(1, pool.view().contentHolds(pool.view().pageOf(own[0])));
        }
    }

    // ------------------------------------------------------------ claims whose page loses its last hold mid-transfer

    /**
     * A transfer holds a writer and a reader claim on a request's page when the request's last hold
     * ends. The late write lands only in quarantine and never counts as written; the late read is
     * refused as stale; once the claims drop, the page is scrubbed, and its next owner can read
     * nothing (read-before-write) and finds only zeros. Returns the raw bytes the next owner's page
     * holds.
     */
    static byte[] lateTransferAfterTheLastHold(UnaryOperator<PageMemory> backend) {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO, UnaryOperator.identity(), backend);
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 1, 1);
            long writer = Leases.claim(pool, a, R1, h[0], ClaimKind.WRITER, 7);
            long readerClaim = Leases.claim(pool, a, R1, h[0], ClaimKind.READER, 7);
            int page = pool.view().pageOf(h[0]);
            pool.release(a, R1, h, 0, 1, ReleaseReason.ABORTED);
            Leases.fillPage(pool, arena, a, R1, writer, 9);
            assertFalse(pool.view().isWritten(writer, 0, 1), "a write into quarantine never counts as written");
            assertThrows(StaleLeaseException.class, () -> pool.read(a, R1, readerClaim, 0, 0, arena.allocate(8)));
            pool.endStep();
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(page), "claims keep the page out of circulation");
            assertTrue(pool.claimWrote(writer, 0, 4), "the claim's own evidence records what it wrote");
            pool.dropClaims(a, R1, new long[] {writer, readerClaim}, 0, 2);
            pool.endStep();
            long[] next = new long[1];
            assertTrue(pool.allocate(b, R2, LeaseKind.OWNER, 1, next, 0));
            assertEquals(page, pool.view().pageOf(next[0]));
            assertThrows(ReadBeforeWriteException.class, () -> pool.read(b, R2, next[0], 0, 0, arena.allocate(8)));
            return PoolProbe.rawPage(t.memory, arena, page).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
        }
    }

    @Test
    void aLateTransferAfterTheLastHoldLandsOnlyInQuarantineAndIsScrubbed() {
        assertTrue(PageRecords.allZero(lateTransferAfterTheLastHold(UnaryOperator.identity())));
    }

    @Test
    void plantedBugABackendThatSkipsTheScrubHandsTheLateWriteToTheNextTenant() {
        assertFalse(PageRecords.allZero(lateTransferAfterTheLastHold(ForwardingPageMemory::skippingScrub)));
    }

    // ------------------------------------------------------------ reclaims under quota, transfers onto a holder

    @Test
    void reclaimsBeyondTheQuotaAnswerGoneAndLeaveThoseSealedPagesReclaimableLater() {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(5), ProtectionLevel.ENCRYPT,
                c -> c.sealer(ctx -> new EpochSealer(ctx.memory())), UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a", TenantPolicy.withQuota(3));
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 3, 1);
            long[] refs = java.util.Arrays.stream(Leases.handles(pool, h)).map(PageHandles::sealedReference).toArray();
            pool.release(a, R1, h, 0, 3, ReleaseReason.FINISHED);
            pool.endStep();
            long[] keep = Leases.allocateWritten(pool, arena, a, R2, 1, 2);
            long[] back = new long[3];
            assertEquals(2, pool.reclaim(a, R3, LeaseKind.OWNER, refs, 0, 3, back, 0), "quota 3, one page owned: two fit");
            assertEquals(LeaseIds.NONE, back[2]);
            int third = PageHandles.page(refs[2]);
            assertEquals(a, pool.view().sealedFor(third), "the hit beyond the quota stays sealed for a");
            assertEquals(3, pool.ownedBy(a));
            assertFalse(PoolProbe.holdsPattern(t.memory, arena, third, a, 1), "and stays ciphertext");
            pool.release(a, R2, keep, 0, 1, ReleaseReason.FINISHED);
            assertEquals(1, pool.reclaim(a, R3, LeaseKind.OWNER, refs, 2, 1, back, 2));
            assertTrue(PoolProbe.holdsPattern(t.memory, arena, third, a, 1));
        }
    }

    @Test
    void aTransferOntoAHolderThatAlreadyHoldsThePageChangesNothing() {
        try (TestPools t = TestPools.create(5, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = Leases.allocateWritten(pool, arena, a, R1, 2, 1);
            long[] ns = new long[1];
            pool.share(a, R1, h, 1, 1, LeaseKind.NAMESPACE, a, NS, ns, 0);
            long digest = pool.stateDigest();
            PageRecords before = PageRecords.capture(pool, t.memory);
            DuplicateLeaseException e = assertThrows(DuplicateLeaseException.class,
                    () -> pool.transfer(a, R1, h, 0, 2, LeaseKind.NAMESPACE, NS, new long[2], 0), "the namespace holds page 2 already");
            assertTrue(e.getMessage().contains("already holds page " + pool.view().pageOf(h[1])), e.getMessage());
            assertThrows(DuplicateLeaseException.class, () -> pool.transfer(a, R1, h, 0, 2, LeaseKind.OWNER, R1, new long[2], 0),
                    "onto itself");
            assertEquals(digest, pool.stateDigest());
            PageRecords.capture(pool, t.memory).assertSameAs(before, Set.of(), "refused transfers");
            long[] moved = new long[1];
            pool.transfer(a, R1, h, 0, 1, LeaseKind.NAMESPACE, NS, moved, 0);
            assertTrue(reads(pool, arena, a, NS, moved[0], a, 1), "the page never passed through having no hold");
        }
    }

    // ------------------------------------------------------------ empty and full batches

    @Test
    void emptyBatchesAtTheEndOfTheirArraysChangeNothingAndFullBatchesApplyWhole() {
        try (TestPools t = TestPools.create(6, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int usable = pool.geometry().usablePages();
            long[] h = Leases.allocateWritten(pool, arena, a, R1, usable, 1);
            long[] claims = new long[usable];
            pool.claim(a, R1, h, 0, usable, ClaimKind.READER, 3, claims, 0);
            long digest = pool.stateDigest();
            int end = h.length;
            pool.release(a, R1, h, end, 0, ReleaseReason.FINISHED);
            pool.checkHeld(a, R1, h, end, 0);
            pool.share(a, R1, h, end, 0, LeaseKind.READER, a, R2, h, end);
            pool.transfer(a, R1, h, end, 0, LeaseKind.NAMESPACE, NS, h, end);
            pool.claim(a, R1, h, end, 0, ClaimKind.WRITER, 3, h, end);
            pool.dropClaims(a, R1, claims, end, 0);
            pool.fenceClaims(a, R1, claims, end, 0);
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 0, h, end));
            assertTrue(pool.allocateRows(0, new int[0], new long[0], new int[0], LeaseKind.OWNER, h, end));
            assertEquals(0, pool.reclaim(a, R1, LeaseKind.OWNER, h, end, 0, h, end));
            assertEquals(digest, pool.stateDigest(), "empty batches change nothing");
            assertThrows(IllegalArgumentException.class, () -> pool.release(a, R1, h, end, 1, ReleaseReason.FINISHED));
            assertThrows(IllegalArgumentException.class, () -> pool.claim(a, R1, h, 0, usable, ClaimKind.WRITER, 3, new long[usable], 1));
            assertEquals(digest, pool.stateDigest());
            pool.dropClaims(a, R1, claims, 0, usable);
            pool.release(a, R1, h, 0, usable, ReleaseReason.FINISHED);
            pool.endStep();
            assertEquals(usable, pool.snapshot().free(), "a full-length release applies whole");
            long[] again = new long[usable];
            assertTrue(pool.allocate(a, R2, LeaseKind.OWNER, usable, again, 0), "and a full-length allocation");
            for (long lease : again) {
                assertTrue(PageRecords.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(lease))
                        .toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)));
            }
        }
    }

    // ------------------------------------------------------------ a "none" answer leaves the pool as it was

    /**
     * Two pages are released (their protection queued) and one is free; an allocation of four cannot
     * be met even after collecting the queue. "None" must leave the pool exactly as it was: collecting
     * the queue early for an allocation that then fails moves pages for nothing.
     */
    @Test
    void anAllocationThatCannotBeMetEvenAfterADrainAnswersNoneWithThePoolUnchanged() {
        try (TestPools t = TestPools.create(4, ProtectionLevel.ZERO)) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[2];
            assertTrue(pool.allocate(a, R1, LeaseKind.OWNER, 2, h, 0));
            pool.release(a, R1, h, 0, 2, ReleaseReason.FINISHED);
            assertEquals(3, pool.available());
            long digest = pool.stateDigest();
            assertFalse(pool.allocate(a, R2, LeaseKind.OWNER, 4, new long[4], 0));
            assertTrue(pool.lastShortfall().contains("asked for 4 pages"), pool.lastShortfall());
            assertEquals(digest, pool.stateDigest(), "none, and the queue was not collected for it");
            assertEquals(2, pool.snapshot().queued());
            assertTrue(pool.allocate(a, R2, LeaseKind.OWNER, 3, new long[3], 0), "three can be met: the drain runs for them");
        }
    }
}
