package dev.kvshield.audit;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.HandOutsHaltedException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.fail;
import dev.kvshield.pool.KvPagePool;

/**
 * COMPLIANCE fails closed: a page dirtied behind the pool's back after its release is caught by
 * verify-zero before reuse, retired, alarmed and charged to the releasing request; an audit sink
 * that cannot write stops hand-outs with a clear error, also for a regulated tenant registered after the sink
 * failed, after the trail closed, after a write naming an unknown tenant, and through a resume or a reader grant.
 */
class ComplianceFailClosedTest {
    private static final byte CANARY = (byte) 0xC3;

    @TempDir
    Path dir;

    /**
     * Planted bug: a late write-after-free (a transfer landing after release) puts bytes into a
     * released page behind the pool's back, right after its scrub.
     */
    private static final class LateWriteAfterFree extends ForwardingPageMemory {
        /** Armed after the pool's start-up scrub: the bug hits released pages only. */
        boolean armed;

        LateWriteAfterFree(PageMemory delegate) {
            super(delegate);
        }

        @Override
        public void scrub(int[] pages, int offset, int count) {
            delegate.scrub(pages, offset, count);
            if (!armed) {
                return;
            }
            try (Arena arena = Arena.ofConfined()) {
                for (int i = offset; i < offset + count; i++) {
                    delegate.write(pages[i], 1, 2, arena.allocate(AuditFixtures.TOKEN_BYTES).fill(CANARY));
                }
            }
        }
    }

    private record Outcome(int page, PageState state, long alarms, List<AuditLog.Line> lines, byte lateByte, boolean handedOutAgain) {}

    private Outcome releaseWithLateWrite(ProtectionLevel level, boolean plantBug) throws IOException {
        Path where = dir.resolve(level + "-" + plantBug);
        LateWriteAfterFree[] planted = new LateWriteAfterFree[1];
        UnaryOperator<PageMemory> wrap = m -> planted[0] = new LateWriteAfterFree(m);
        try (TestPools p = TestPools.create(TestPools.tinyGeometry(3), level, UnaryOperator.identity(), wrap);
                Arena arena = Arena.ofConfined()) {
            planted[0].armed = plantBug;
            AuditTrail trail = AuditTrail.attach(p.pool, AuditFixtures.config(where, AuditKeys.generateInMemory(), 1 << 20).build());
            int a = p.pool.tenants().register("alice");
            long owner = Owners.request(7);
            long[] h = new long[1];
            p.pool.allocate(a, owner, LeaseKind.OWNER, 1, h, 0);
            int page = p.pool.view().pageOf(h[0]);
            p.pool.write(a, owner, h[0], 1, 0, Patterns.fill(arena, 4L * AuditFixtures.TOKEN_BYTES, a, 7, page, 1));
            p.pool.release(a, owner, h, 0, 1, ReleaseReason.FINISHED);
            p.pool.endStep();
            trail.requestFinished(a, 7, RequestOutcome.COMPLETED);
            p.pool.endStep();
            MemorySegment slot = arena.allocate(AuditFixtures.TOKEN_BYTES);
            p.memory.read(page, 1, 2, slot);
            // Hand out every page the pool will give: a retired page must not be among them.
            long[] all = new long[2];
            int got = p.pool.available();
            boolean again = false;
            if (got > 0 && p.pool.allocate(a, Owners.request(8), LeaseKind.OWNER, got, all, 0)) {
                for (int i = 0; i < got; i++) {
                    again |= p.pool.view().pageOf(all[i]) == page;
                }
            }
            PageState state = p.pool.view().stateOf(page);
            trail.close();
            return new Outcome(page, state, trail.alarms(), AuditLog.read(List.of(where)), slot.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 0),
                    again);
        }
    }

    @Test
    void complianceCatchesAWriteAfterFreeBeforeReuse() throws IOException {
        Outcome o = releaseWithLateWrite(ProtectionLevel.COMPLIANCE, true);
        assertEquals(CANARY, o.lateByte(), "the planted late write landed");
        assertEquals(PageState.RETIRED, o.state());
        assertFalse(o.handedOutAgain(), "a page that failed verification is never handed out");
        assertEquals(1, o.alarms());
        AuditLog.Line alarm = o.lines().stream().filter(l -> l.type().equals("verify_failed")).findFirst().orElseThrow();
        assertEquals(Boolean.TRUE, alarm.fields().get("alarm"));
        assertEquals(List.of(new AuditLog.PageEntry(o.page(), alarm.pages().getFirst().generation(), 1)), alarm.pages(),
                "an alarm is a record of its own, about one page");
        assertEquals(7, alarm.number("releasedByReq", -1), "the alarm names the request whose release produced the page");
        assertTrue(o.lines().stream().anyMatch(l -> l.type().equals("retire") && "verify_failed".equals(l.string("reason"))));
        AuditLog.Line summary = o.lines().stream().filter(l -> l.type().equals("summary")).findFirst().orElseThrow();
        assertEquals(1, summary.number("verifyFailedPages", -1), "the releasing request is marked");
    }

    @Test
    void withoutTheLateWriteThePageIsReusedAndNoAlarmRaised() throws IOException {
        Outcome o = releaseWithLateWrite(ProtectionLevel.COMPLIANCE, false);
        assertEquals(0, o.lateByte());
        assertEquals(0, o.alarms());
        assertTrue(o.handedOutAgain());
    }

    @Test
    void zeroLevelDoesNotVerifyAndHandsTheDirtyPageOn() throws IOException {
        // Why COMPLIANCE verifies: under ZERO the same late write survives into the next owner's page.
        Outcome o = releaseWithLateWrite(ProtectionLevel.ZERO, true);
        assertEquals(CANARY, o.lateByte());
        assertEquals(0, o.alarms());
        assertTrue(o.handedOutAgain());
    }

    /** A sink that accepts {@code okAppends} batches, then fails as a full disk does. */
    private static final class DiskFullSink implements AuditSink {
        private final AuditSink delegate;
        private int okAppends;

        DiskFullSink(AuditSink delegate, int okAppends) {
            this.delegate = delegate;
            this.okAppends = okAppends;
        }

        @Override
        public void append(List<String> lines) throws IOException {
            if (okAppends-- <= 0) {
                throw new IOException("No space left on device");
            }
            delegate.append(lines);
        }

        @Override
        public void sync() throws IOException {
            delegate.sync();
        }

        @Override
        public String describe() {
            return "disk-full(" + delegate.describe() + ")";
        }

        @Override
        public void close() throws IOException {
            delegate.close();
        }
    }

    private AuditTrail trailWithFailingSink(TestPools p, Path where, int okAppends) throws IOException {
        AuditSink sink = new DiskFullSink(AuditSink.rotatingFiles(where, "audit", 1 << 20), okAppends);
        return AuditTrail.attach(p.pool, AuditConfig.builder().sink(sink).signingKey(AuditKeys.generateInMemory()).build());
    }

    /**
     * Alice allocates one page into {@code h[0]} and the step ends: the step's records meet the full
     * disk on the trail's writer thread; the next step boundary waits for that write, so the failure
     * has landed when it returns.
     */
    private static int firstStepMeetsFullDisk(TestPools p, long[] h) {
        int a = p.pool.tenants().register("alice");
        assertTrue(p.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
        p.pool.endStep();
        p.pool.endStep();
        return a;
    }

    @Test
    void complianceStopsHandingOutPagesWhenTheSinkCannotWrite() throws IOException {
        try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            AuditTrail trail = trailWithFailingSink(p, dir.resolve("c"), 1);
            long[] h = new long[2];
            int a = firstStepMeetsFullDisk(p, h);
            long digest = p.pool.stateDigest();
            HandOutsHaltedException e = assertThrows(HandOutsHaltedException.class,
                    () -> p.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, h, 1));
            assertTrue(e.getMessage().contains("audit sink") && e.getMessage().contains("No space left on device")
                    && e.getMessage().contains("COMPLIANCE"), e.getMessage());
            assertEquals(digest, p.pool.stateDigest(), "the refused allocation changed nothing");
            assertTrue(trail.failure().contains("No space left on device"));
            assertTrue(trail.recordsDropped() > 0);
            trail.close();
        }
    }

    /** A sink that logs its appends and syncs into {@code log} and fails every sync after {@code okSyncs}, as a dying disk does. */
    private static final class SyncLoggingSink implements AuditSink {
        private final AuditSink delegate;
        private final List<String> log;
        private int okSyncs;

        SyncLoggingSink(AuditSink delegate, List<String> log, int okSyncs) {
            this.delegate = delegate;
            this.log = log;
            this.okSyncs = okSyncs;
        }

        @Override
        public void append(byte[] bytes, int offset, int length) throws IOException {
            delegate.append(bytes, offset, length);
        }

        @Override
        public void append(List<String> lines) throws IOException {
            delegate.append(lines);
        }

        @Override
        public void sync() throws IOException {
            if (okSyncs-- <= 0) {
                log.add("sync failed");
                throw new IOException("Input/output error");
            }
            delegate.sync();
            log.add("synced");
        }

        @Override
        public String describe() {
            return "sync-logging(" + delegate.describe() + ")";
        }

        @Override
        public void close() throws IOException {
            delegate.close();
        }
    }

    /**
     * Three steps of one page each on a COMPLIANCE pool, a checkpoint after every step, syncs failing
     * after {@code okSyncs}; returns the log of syncs and shipments, in order, after the trail closed.
     */
    private List<String> checkpointEveryStep(TestPools p, String name, int okSyncs, AuditTrail[] trail) throws IOException {
        List<String> log = java.util.Collections.synchronizedList(new java.util.ArrayList<>());
        AuditSink sink = new SyncLoggingSink(AuditSink.rotatingFiles(dir.resolve(name), "audit", 1 << 20), log, okSyncs);
        trail[0] = AuditTrail.attach(p.pool, AuditConfig.builder().sink(sink).signingKey(AuditKeys.generateInMemory())
                .checkpointEveryRecords(1).shipper(line -> log.add("shipped " + line.substring(0, line.indexOf(",\"prev\"")))).build());
        int a = p.pool.tenants().register("alice");
        long[] h = new long[1];
        for (int step = 0; step < 3 && p.pool.available() > 0; step++) {
            try {
                p.pool.allocate(a, Owners.request(step), LeaseKind.OWNER, 1, h, 0);
            } catch (HandOutsHaltedException e) {
                log.add("halted");
                break;
            }
            p.pool.endStep();
        }
        trail[0].close();
        return log;
    }

    @Test
    void aCheckpointIsShippedOnlyAfterItsSyncAndAFailedSyncStopsHandOuts() throws IOException {
        AuditTrail[] trail = new AuditTrail[1];
        try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            List<String> log = checkpointEveryStep(p, "healthy", Integer.MAX_VALUE, trail);
            // Twin: with a healthy disk every checkpoint (three periodic, the final) leaves the host, each after its sync.
            assertEquals(8, log.size(), log::toString);
            for (int i = 0; i < log.size(); i += 2) {
                assertEquals("synced", log.get(i), log::toString);
                assertTrue(log.get(i + 1).startsWith("shipped {\"seq\":"), log::toString);
            }
            assertEquals(null, trail[0].failure());
        }
        try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            List<String> log = checkpointEveryStep(p, "dying", 1, trail);
            assertEquals("synced", log.get(0), log::toString);
            assertTrue(log.get(1).startsWith("shipped"), log::toString);
            // Checkpoints queued before the failure was seen fail their syncs too; none of them leaves the host.
            List<String> after = log.subList(2, log.size());
            assertTrue(after.contains("sync failed") && after.stream().allMatch(l -> l.equals("sync failed") || l.equals("halted")),
                    "nothing is shipped once a sync failed: " + log);
            assertTrue(trail[0].failure().contains("Input/output error"), trail[0].failure());
            HandOutsHaltedException e = assertThrows(HandOutsHaltedException.class,
                    () -> p.pool.allocate(0, Owners.request(9), LeaseKind.OWNER, 1, new long[1], 0));
            assertTrue(e.getMessage().contains("Input/output error") && e.getMessage().contains("COMPLIANCE"), e.getMessage());
        }
    }

    @Test
    void aRegulatedTenantMakesAZeroPoolFailClosedToo() throws IOException {
        try (TestPools p = TestPools.create(9, ProtectionLevel.ZERO)) {
            int a = p.pool.tenants().register("bank", TenantPolicy.regulatedTenant());
            assertEquals(ProtectionLevel.COMPLIANCE, p.pool.levelOf(a));
            AuditTrail trail = trailWithFailingSink(p, dir.resolve("r"), 0);
            long[] h = new long[1];
            assertThrows(HandOutsHaltedException.class, () -> p.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            trail.close();
        }
    }

    @Test
    void otherLevelsKeepRunningAndCountDroppedRecords() throws IOException {
        try (TestPools p = TestPools.create(9, ProtectionLevel.ZERO)) {
            AuditTrail trail = trailWithFailingSink(p, dir.resolve("z"), 1);
            long[] h = new long[3];
            int a = firstStepMeetsFullDisk(p, h);
            long droppedAtFailure = trail.recordsDropped();
            assertTrue(droppedAtFailure >= 2, "the tenant and allocate records of the failed step: " + droppedAtFailure);
            assertTrue(p.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 2, h, 1), "ZERO keeps serving");
            assertNotEquals(droppedAtFailure, trail.recordsDropped());
            assertEquals(droppedAtFailure + 2, trail.recordsDropped(), "each later event is counted as dropped");
            trail.close();
        }
    }

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
}
