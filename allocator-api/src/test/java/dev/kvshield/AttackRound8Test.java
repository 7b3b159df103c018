package dev.kvshield;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.HandOutsHaltedException;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.testing.TestPools;
import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Attack round 8 on allocator-api: each test failed before its fix (the defect it names is in its javadoc). */
class AttackRound8Test {
    @TempDir
    Path dir;

    /** A trail over rotating files in the test's directory, attached to {@code pool}. */
    private AuditTrail fileTrail(KvPagePool pool) throws IOException {
        return AuditTrail.attach(pool, AuditConfig.builder().sink(AuditSink.rotatingFiles(dir, "audit", 1 << 20))
                .signingKey(AuditKeys.generateInMemory()).build());
    }

    /** A sink whose disk is full from the first append. */
    private static final class FullDisk implements AuditSink {
        @Override
        public void append(List<String> lines) throws IOException {
            throw new IOException("No space left on device");
        }

        @Override
        public void sync() throws IOException {
            throw new IOException("No space left on device");
        }

        @Override
        public String describe() {
            return "full-disk";
        }

        @Override
        public void close() {}
    }

    /**
     * Promise (README, "Compliance mode and the audit trail"): "If the sink cannot write or sync, a
     * pool where COMPLIANCE applies stops handing out pages (HandOutsHaltedException naming the
     * sink's error)"; AuditTrail javadoc: "COMPLIANCE (the pool's level, or any tenant's, e.g. a
     * regulated tenant) stops handing out pages"; README: "Guards are never switchable"; the halt
     * reason itself says "COMPLIANCE does not run unaudited".
     *
     * <p>Was (fail-open): whether COMPLIANCE applies is decided once, at the moment the sink
     * fails (AuditTrail.complianceApplies()). In a ZERO pool whose sink fails before any regulated
     * tenant is registered, the trail only logs and keeps dropping records; a regulated tenant
     * registered afterwards is handed pages with a dead audit trail (every one of its records
     * dropped), because hand-outs only check that some trail is attached.
     */
    @Test
    void aRegulatedTenantRegisteredAfterTheSinkFailedGetsPagesUnaudited() {
        try (TestPools p = TestPools.bare(TestPools.tinyGeometry(9), ProtectionLevel.ZERO, c -> c, m -> m)) {
            KvPagePool pool = p.pool;
            AuditTrail trail = AuditTrail.attach(pool, AuditConfig.builder().sink(new FullDisk())
                    .signingKey(AuditKeys.generateInMemory()).build());
            int alice = pool.tenants().register("alice");
            long[] h = new long[4];
            assertTrue(pool.allocate(alice, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.endStep();
            pool.endStep(); // the next boundary waits for the writer: the failure has landed
            assertNotNull(trail.failure(), "precondition: the audit sink failed");

            int bank = pool.tenants().register("bank", TenantPolicy.regulatedTenant());
            assertEquals(ProtectionLevel.COMPLIANCE, pool.levelOf(bank));
            HandOutsHaltedException e = assertThrows(HandOutsHaltedException.class,
                    () -> pool.allocate(bank, Owners.request(2), LeaseKind.OWNER, 1, h, 1),
                    "a COMPLIANCE tenant was handed a page while the audit trail drops every record");
            assertTrue(e.getMessage().contains("No space left on device"), e.getMessage());
            trail.close();
        }
    }

    /**
     * Promise (KvPagePool.attachAuditTrail javadoc): "tenants whose level requires one get pages only
     * once it listens"; README: COMPLIANCE = "audit everything, fail closed"; a trail whose sink
     * cannot write halts hand-outs ("COMPLIANCE does not run unaudited").
     *
     * <p>Was (fail-open): AuditTrail.close() stops the trail (every later event is counted as
     * dropped, AuditTrail.store) but the pool still counts it as attached forever
     * (PageEvents.auditTrailAttached is a sticky boolean), so a COMPLIANCE pool keeps handing out
     * pages, allocations and releases alike going unrecorded, after its only trail was closed.
     */
    @Test
    void aComplianceThatOutlivesItsClosedTrailHandsOutPagesUnaudited() throws IOException {
        try (TestPools p = TestPools.bare(TestPools.tinyGeometry(9), ProtectionLevel.COMPLIANCE, c -> c, m -> m)) {
            KvPagePool pool = p.pool;
            AuditTrail trail = fileTrail(pool);
            int alice = pool.tenants().register("alice");
            long[] h = new long[2];
            assertTrue(pool.allocate(alice, Owners.request(1), LeaseKind.OWNER, 1, h, 0), "audited hand-out");
            pool.endStep();
            trail.close();
            long droppedBefore = trail.recordsDropped();
            try {
                pool.allocate(alice, Owners.request(2), LeaseKind.OWNER, 1, h, 1);
            } catch (HandOutsHaltedException expected) {
                return;
            }
            fail("a COMPLIANCE pool handed out page " + pool.view().pageOf(h[1]) + " after its only audit trail was closed;"
                    + " the trail dropped " + (trail.recordsDropped() - droppedBefore) + " event(s) of that hand-out");
        }
    }

    /**
     * Promise (brief/README): bad input, "geometry that does not fit", fails closed with a specific
     * exception; PageMemory: "one region per buffer", page p of buffer b at p * pageBytes(b); the
     * pool's core promise: one request's KV never reaches another tenant. The bridge refuses aliased
     * KV buffers in Python ("each byte of KV must belong to one buffer", buffers.py), but the Java
     * entry point every engine adapter uses does not.
     *
     * <p>Was (isolation): ExternalPageMemory.wrap accepts buffer regions that overlap (here buffer
     * V starts one page into buffer K), so page 1's V bytes ARE page 2's K bytes. A pool over it hands
     * page 1 to tenant "mallory" and page 2 to tenant "victim", and mallory reads the victim's K
     * through its own lease, every guard passing (its slot was written in its generation).
     */
    @Test
    void overlappingExternalBuffersLetOneTenantReadAnothersPage() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(4);
        // tinyGeometry: 2 layers of K and V; alias buffer 1 (layer 0 V) one page into buffer 0 (layer 0 K).
        long pageBytes = g.pageBytes(0);
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            java.lang.foreign.MemorySegment[] regions = new java.lang.foreign.MemorySegment[g.bufferCount()];
            java.lang.foreign.MemorySegment shared = arena.allocate(g.bufferBytes(0) + pageBytes, 64);
            regions[0] = shared.asSlice(0, g.bufferBytes(0));
            regions[1] = shared.asSlice(pageBytes, g.bufferBytes(1));
            for (int b = 2; b < regions.length; b++) {
                regions[b] = arena.allocate(g.bufferBytes(b), 64);
            }
            dev.kvshield.memory.PageMemory memory;
            try {
                memory = dev.kvshield.memory.external.ExternalPageMemory.wrap(g, regions);
            } catch (dev.kvshield.geometry.InvalidGeometryException refused) {
                return; // the promised behaviour: aliased buffers refused before any page exists
            }
            KvPagePool pool = KvPagePool.create(dev.kvshield.pool.PoolConfig.builder(g).level(ProtectionLevel.ZERO).build(), memory);
            int mallory = pool.tenants().register("mallory");
            int victim = pool.tenants().register("victim");
            long m = Owners.request(1);
            long v = Owners.request(2);
            long[] ml = new long[1];
            long[] vl = new long[1];
            assertTrue(pool.allocate(mallory, m, LeaseKind.OWNER, 1, ml, 0));
            assertTrue(pool.allocate(victim, v, LeaseKind.OWNER, 1, vl, 0));
            int mPage = pool.view().pageOf(ml[0]);
            int vPage = pool.view().pageOf(vl[0]);
            assertEquals(mPage + 1, vPage, "precondition: the victim's page follows mallory's");
            int tokenBytes = g.bytesPerToken(0);
            java.lang.foreign.MemorySegment token = arena.allocate(tokenBytes);
            pool.write(mallory, m, ml[0], 1, 0, token); // mallory writes (zeros) into its own V, slot 0
            java.lang.foreign.MemorySegment secret = arena.allocate(tokenBytes).fill((byte) 0x5A);
            pool.write(victim, v, vl[0], 0, 0, secret); // the victim writes its K, slot 0
            java.lang.foreign.MemorySegment got = arena.allocate(tokenBytes);
            pool.read(mallory, m, ml[0], 1, 0, got); // mallory reads its own V, slot 0
            byte[] seen = got.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
            pool.close();
            assertTrue(!java.util.Arrays.equals(seen, secret.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)),
                    "tenant mallory read tenant victim's KV bytes through its own lease: ExternalPageMemory.wrap accepted"
                            + " overlapping buffer regions");
        }
    }

    /**
     * Promise (KvPagePool javadoc): "Misuse throws a specific KvShieldException naming the values, is
     * counted and emitted, and leaves the pool exactly as it was"; the brief: an unknown tenant gets
     * its specific exception. README: the audit trail records "every rejection".
     *
     * <p>Was (crash / fail-closed turned into a denial of service): write, read and markWritten
     * never check the tenant id (KvPagePool.write -> DataAccess -> LeaseTable.checkHeld), so a call
     * naming an unregistered tenant is refused as FOREIGN and its REJECT event carries tenant 99.
     * At the step boundary the audit trail writes a tenant record for 99 first
     * (AuditTrail.declare -> TenantRegistry.name(99)), which throws UnknownTenantException on the
     * writer: the trail fails for good ("Encoding or signing failed") and, the pool being COMPLIANCE,
     * every hand-out stops. One bad id from any caller permanently halts the pool and loses the audit
     * trail; under other levels the trail silently drops every later record. The same happens through
     * read, markWritten, KvPagePool.refuseFree(page, 99, holder) and AuditTrail.requestFinished(99, ...).
     */
    @Test
    void aWriteNamingAnUnknownTenantKillsTheAuditTrailAndHaltsACompliancePool() throws IOException {
        try (TestPools p = TestPools.bare(TestPools.tinyGeometry(9), ProtectionLevel.COMPLIANCE, c -> c, m -> m);
                java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            KvPagePool pool = p.pool;
            AuditTrail trail = fileTrail(pool);
            int alice = pool.tenants().register("alice");
            long owner = Owners.request(1);
            long[] h = new long[2];
            assertTrue(pool.allocate(alice, owner, LeaseKind.OWNER, 1, h, 0));
            java.lang.foreign.MemorySegment token = arena.allocate(pool.geometry().bytesPerToken(0));
            RuntimeException refused = assertThrows(RuntimeException.class, () -> pool.write(99, owner, h[0], 0, 0, token));
            assertTrue(refused.getMessage().contains("99"), refused.getMessage());
            pool.endStep();
            pool.endStep(); // the boundary waits for the writer
            try {
                assertEquals(null, trail.failure(), "a refused call with an unknown tenant id failed the audit trail");
                assertTrue(pool.allocate(alice, Owners.request(2), LeaseKind.OWNER, 1, h, 1),
                        "alice is still served after someone's misuse was refused");
            } finally {
                trail.close();
            }
        }
    }

    /**
     * Promise (DESIGN.md invariant 4, "Written extent": "Per page and generation the pool knows which
     * token slots were written. Reading a slot not written in the current generation is an error
     * (read-before-write), not data"; NONE keeps "every guard"; WrittenExtentTest: "NONE leaves A's
     * bytes in memory, but B cannot read them through the pool: a failed request, not a leak").
     *
     * <p>Was (isolation at NONE): the written extent is one bit per slot for ALL buffers, but
     * KvPagePool.write writes ONE buffer and marks the slot written for every buffer. Tenant B, handed
     * the page tenant A left (NONE: not scrubbed), writes slot 0 of buffer 0 only and then reads slot 0
     * of buffer 1 through its own lease: the guard passes and B gets A's KV bytes. The audit trail's
     * exposure tracker is per slot too, so it records no foreign read either.
     */
    @Test
    void underNoneAOneBufferWriteUnlocksThePreviousTenantsBytesInEveryOtherBuffer() {
        try (TestPools p = TestPools.create(TestPools.tinyGeometry(2), ProtectionLevel.NONE, c -> c, m -> m);
                java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            KvPagePool pool = p.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long ra = Owners.request(1);
            long rb = Owners.request(2);
            int tokenBytes = pool.geometry().bytesPerToken(1);
            long[] la = new long[1];
            assertTrue(pool.allocate(a, ra, LeaseKind.OWNER, 1, la, 0));
            java.lang.foreign.MemorySegment[] secret = new java.lang.foreign.MemorySegment[pool.geometry().bufferCount()];
            for (int buf = 0; buf < secret.length; buf++) {
                secret[buf] = arena.allocate(tokenBytes).fill((byte) 0x5A);
            }
            pool.writeAllBuffers(a, ra, la[0], 0, secret); // A's KV for slot 0, every buffer
            pool.release(a, ra, la, 0, 1, dev.kvshield.audit.ReleaseReason.FINISHED);
            pool.endStep();

            long[] lb = new long[1];
            assertTrue(pool.allocate(b, rb, LeaseKind.OWNER, 1, lb, 0));
            assertEquals(pool.view().pageOf(la[0]), pool.view().pageOf(lb[0]), "precondition: B got A's page");
            pool.write(b, rb, lb[0], 0, 0, arena.allocate(tokenBytes)); // B writes buffer 0, slot 0 only
            java.lang.foreign.MemorySegment got = arena.allocate(tokenBytes);
            try {
                pool.read(b, rb, lb[0], 1, 0, got); // ... and reads buffer 1, slot 0, which it never wrote
            } catch (dev.kvshield.extent.ReadBeforeWriteException expected) {
                return;
            }
            fail("tenant b read buffer 1 of slot 0, never written in its generation; it holds tenant a's bytes: "
                    + java.util.HexFormat.of().formatHex(got.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)));
        }
    }

    /**
     * The same class in a handoff: a transfer that landed only buffer 0 of every page must not commit
     * (its other buffers hold whatever the pages' previous owners left); one that landed every
     * buffer, one buffer at a time, commits and reads back its own bytes in each.
     */
    @Test
    void aHandoffCommitsOnlyWhatEveryBufferReceived() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(8);
        for (boolean everyBuffer : new boolean[] {false, true}) {
            try (TestPools p = TestPools.create(g, ProtectionLevel.NONE, c -> c, m -> m);
                    java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
                KvPagePool pool = p.pool;
                int tenant = pool.tenants().register("client");
                dev.kvshield.handoff.HandoffReceiver receiver = new dev.kvshield.handoff.HandoffReceiver(pool, a -> { });
                receiver.handshake(3, receiver.effectiveLimitTokens());
                dev.kvshield.handoff.Reservation r = receiver.reserve(tenant, 5, 2L * g.pageSizeTokens(), 3);
                for (int i = 0; i < r.pageCount(); i++) {
                    for (int b = 0; b < (everyBuffer ? g.bufferCount() : 1); b++) {
                        receiver.write(r, i, b, 0, arena.allocate(g.pageBytes(b)).fill((byte) (0x10 + b)));
                    }
                }
                receiver.acknowledge(r);
                boolean committed = receiver.commit(r, r.sequenceTokens()).committed();
                assertEquals(everyBuffer, committed, everyBuffer ? "a transfer of every buffer did not commit"
                        : "a transfer that landed only buffer 0 committed: its other buffers were never received");
                if (committed) {
                    java.lang.foreign.MemorySegment got = arena.allocate(g.bytesPerToken(1));
                    pool.read(tenant, Owners.request(5), r.lease(0), 1, 0, got);
                    assertEquals((byte) 0x11, got.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0));
                }
            }
        }
    }

    /**
     * {@code resumeHandOuts} lifts an operator's or a failure's halt, never the audit requirement: a
     * COMPLIANCE tenant gets nothing while its trail is failed, and no reader grant either.
     */
    @Test
    void neitherAResumeNorAReaderGrantRunsACompliancePoolUnaudited() throws IOException {
        try (TestPools p = TestPools.bare(TestPools.tinyGeometry(9), ProtectionLevel.COMPLIANCE, c -> c, m -> m)) {
            KvPagePool pool = p.pool;
            AuditTrail trail = fileTrail(pool);
            int system = pool.tenants().register("system");
            int alice = pool.tenants().register("alice");
            pool.declareSharedNamespace(system);
            long ns = Owners.namespace(1);
            long[] h = new long[2];
            assertTrue(pool.allocate(system, ns, LeaseKind.NAMESPACE, 1, h, 0));
            pool.endStep();
            trail.close();
            pool.resumeHandOuts();
            HandOutsHaltedException allocate = assertThrows(HandOutsHaltedException.class,
                    () -> pool.allocate(alice, Owners.request(2), LeaseKind.OWNER, 1, h, 1));
            assertTrue(allocate.getMessage().contains("closed"), allocate.getMessage());
            long[] reader = new long[1];
            assertThrows(HandOutsHaltedException.class,
                    () -> pool.share(system, ns, h, 0, 1, LeaseKind.READER, alice, Owners.request(2), reader, 0));
        }
    }

    /** Regions that touch but do not overlap are accepted, through both of the external backend's entry points. */
    @Test
    void adjacentExternalBuffersAreAcceptedAndOverlappingAddressesRefused() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(4);
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            long total = 0;
            for (int b = 0; b < g.bufferCount(); b++) {
                total += g.bufferBytes(b);
            }
            java.lang.foreign.MemorySegment all = arena.allocate(total, 64);
            long[] addresses = new long[g.bufferCount()];
            long[] sizes = new long[g.bufferCount()];
            long at = 0;
            for (int b = 0; b < addresses.length; b++) {
                addresses[b] = all.address() + at;
                sizes[b] = g.bufferBytes(b);
                at += sizes[b];
            }
            dev.kvshield.memory.external.ExternalPageMemory.wrap(g, addresses, sizes).close();
            addresses[2] = addresses[1] + sizes[1] - 1; // one byte into buffer 1
            dev.kvshield.geometry.InvalidGeometryException e = assertThrows(dev.kvshield.geometry.InvalidGeometryException.class,
                    () -> dev.kvshield.memory.external.ExternalPageMemory.wrap(g, addresses, sizes));
            assertTrue(e.getMessage().contains("overlaps"), e.getMessage());
        }
    }

    /** The lease table's most leases fit its record array (8 longs each) in one Java array. */
    @Test
    void theLargestLeaseTableFitsOneArray() {
        assertTrue(((long) dev.kvshield.lease.LeaseTable.MAX_CAPACITY << 3) < Integer.MAX_VALUE - 8);
    }
}
