package dev.kvshield.audit;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static dev.kvshield.audit.PageEventType.ALLOCATE;
import static dev.kvshield.audit.PageEventType.FREE;
import static dev.kvshield.audit.PageEventType.PROTECT_DONE;
import static dev.kvshield.audit.PageEventType.PROTECT_ISSUED;
import static dev.kvshield.audit.PageEventType.READ;
import static dev.kvshield.audit.PageEventType.RELEASE;
import static dev.kvshield.audit.PageEventType.WRITE;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.internal.Json;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.ForeignLeaseException;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Precision and recall of the exposure query: a scripted event stream of a pool with a planted
 * isolation bug (no generation bump, no scrub, a page handed to a second owner while the first
 * still reads it) leaks to known requests, and the query names exactly those requests and the
 * tenants whose data reached them; the same workload on a correct pool shows none, and a real pool
 * hit by misuse shows only blocked attempts.
 */
class ExposureQueryTest {
    private static final String[] TENANTS = {"alice", "bob", "carol", "dave"};
    private static final int A = 0;
    private static final int B = 1;
    private static final int C = 2;
    private static final int D = 3;
    private static final long FULL = 4; // slots [0, 4)

    @TempDir
    Path dir;

    private AuditTrail scriptedTrail(Path where) throws IOException {
        AuditConfig config = AuditFixtures.config(where, AuditKeys.generateInMemory(), 1 << 20).build();
        return AuditTrail.detached(config, new AuditTrail.Scope("scripted", 0, 8, 4, ProtectionLevel.NONE, t -> TENANTS[t]));
    }

    private static long slots(long from, long to) {
        return (from << 32) | to;
    }

    private static void ev(AuditTrail t, PageEventType type, int page, int gen, int tenant, long request, long detail) {
        t.onPageEvent(type, page, gen, tenant, Owners.request(request), detail);
    }

    /** Frees a page; {@code bumpGeneration} false is the planted bug (and no scrub: level NONE). */
    private static int release(AuditTrail t, int page, int gen, int tenant, long request, boolean bumpGeneration) {
        int next = bumpGeneration ? gen + 1 : gen;
        ev(t, RELEASE, page, next, tenant, request, ReleaseReason.FINISHED.ordinal());
        t.onPageEvent(PROTECT_ISSUED, page, next, tenant, Owners.NOBODY, ProtectionLevel.NONE.ordinal());
        t.onPageEvent(PROTECT_DONE, page, next, tenant, Owners.NOBODY, ProtectionLevel.NONE.ordinal());
        t.onPageEvent(FREE, page, next, -1, Owners.NOBODY, 0);
        return next;
    }

    /**
     * The workload. With {@code bug}, generations are not bumped and page 1 is handed to bob while
     * alice's request 1 still reads it. Leaks (with the bug): request 1 (alice) gets bob's data,
     * request 3 (carol) gets alice's left-overs of page 2, request 5 (dave) reads slots never
     * written in its generation. Without the bug a correct pool hands each page over at a new
     * generation, and every read is of slots its reader's tenant wrote.
     */
    private static void workload(AuditTrail t, boolean bug) {
        // alice request 1 owns page 1 and reads her own data
        ev(t, ALLOCATE, 1, 0, A, 1, 0);
        ev(t, WRITE, 1, 0, A, 1, slots(0, FULL));
        ev(t, READ, 1, 0, A, 1, slots(0, FULL));
        t.onStepBoundary(1);
        if (bug) {
            // the bug: page 1 handed to bob (request 2) at the same generation while alice still reads it
            ev(t, ALLOCATE, 1, 0, B, 2, 0);
            ev(t, WRITE, 1, 0, B, 2, slots(0, 2));
            ev(t, READ, 1, 0, A, 1, slots(0, FULL));
        } else {
            ev(t, READ, 1, 0, A, 1, slots(0, FULL));
            int g = release(t, 1, 0, A, 1, true);
            ev(t, ALLOCATE, 1, g, B, 2, 0);
            ev(t, WRITE, 1, g, B, 2, slots(0, 2));
            ev(t, READ, 1, g, B, 2, slots(0, 2));
        }
        ev(t, READ, 1, 0 + (bug ? 0 : 1), B, 2, slots(0, 2));
        t.requestFinished(A, 1, RequestOutcome.COMPLETED);
        t.requestFinished(B, 2, RequestOutcome.COMPLETED);
        t.onStepBoundary(2);
        // alice request 4 fills page 2 and frees it; carol request 3 gets it next
        ev(t, ALLOCATE, 2, 0, A, 4, 0);
        ev(t, WRITE, 2, 0, A, 4, slots(0, FULL));
        int g2 = release(t, 2, 0, A, 4, !bug);
        t.requestFinished(A, 4, RequestOutcome.COMPLETED);
        ev(t, ALLOCATE, 2, g2, C, 3, 0);
        if (!bug) {
            ev(t, WRITE, 2, g2, C, 3, slots(0, FULL));
        }
        ev(t, READ, 2, g2, C, 3, slots(0, FULL));
        t.requestFinished(C, 3, RequestOutcome.COMPLETED);
        // dave request 5 reads a slot never written in its generation
        ev(t, ALLOCATE, 3, 1, D, 5, 0);
        if (!bug) {
            ev(t, WRITE, 3, 1, D, 5, slots(0, 1));
        }
        ev(t, READ, 3, 1, D, 5, slots(0, 1));
        t.requestFinished(D, 5, RequestOutcome.ABORTED);
        // alice shares a prefix: request 7 reads page 4 that her request 6 wrote (same tenant, fine)
        ev(t, ALLOCATE, 4, 0, A, 6, 0);
        ev(t, WRITE, 4, 0, A, 6, slots(0, FULL));
        ev(t, READ, 4, 0, A, 7, slots(0, FULL));
        t.requestFinished(A, 6, RequestOutcome.COMPLETED);
        t.requestFinished(A, 7, RequestOutcome.COMPLETED);
        t.onStepBoundary(3);
    }

    private static Map<String, Set<String>> exposedBy(ExposureQuery.Report r) {
        return r.exposed().stream().collect(Collectors.toMap(e -> e.tenant() + "/" + e.request(),
                e -> new TreeSet<>(e.sourceTenants())));
    }

    /** Runs the scripted workload into a trail under {@code dir/name} and returns its records. */
    private List<AuditLog.Line> scripted(String name, boolean bug) throws IOException {
        Path where = dir.resolve(name);
        try (AuditTrail t = scriptedTrail(where)) {
            workload(t, bug);
        }
        return AuditLog.read(List.of(where));
    }

    @Test
    void plantedBugLeaksAreFoundExactly() throws IOException {
        List<AuditLog.Line> lines = scripted("bug", true);
        ExposureQuery.Report r = ExposureQuery.run(lines, Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(Map.of("alice/1", Set.of("bob"), "carol/3", Set.of("alice"), "dave/5", Set.of()), exposedBy(r));
        assertEquals(List.of(), r.blocked());
        ExposureQuery.Exposure dave = r.exposed().stream().filter(e -> e.request() == 5).findFirst().orElseThrow();
        assertEquals("aborted", dave.outcome());
        assertEquals(1, dave.unwrittenSlotReads());
        ExposureQuery.Exposure alice = r.exposed().stream().filter(e -> e.request() == 1).findFirst().orElseThrow();
        assertEquals(2, alice.foreignSlotReads(), "bob wrote slots 0 and 1 of alice's page");
        // The live trail's own summaries agree with the offline query.
        long flagged = lines.stream().filter(l -> l.type().equals("summary"))
                .filter(l -> Boolean.TRUE.equals(l.fields().get("exposed"))).count();
        assertEquals(3, flagged);
    }

    /** Alice's request 1 fills page 1 and releases it under {@code level}; bob's request 2 is handed it and writes it. */
    private List<AuditLog.Line> handedOver(String name, boolean readsRecorded, ProtectionLevel level) throws IOException {
        Path where = dir.resolve(name);
        AuditConfig config = AuditFixtures.config(where, AuditKeys.generateInMemory(), 1 << 20).readsRecorded(readsRecorded).build();
        try (AuditTrail t = AuditTrail.detached(config, new AuditTrail.Scope("bridge", 0, 8, 4, level, x -> TENANTS[x]))) {
            ev(t, ALLOCATE, 1, 0, A, 1, 0);
            ev(t, WRITE, 1, 0, A, 1, slots(0, 3));
            ev(t, RELEASE, 1, 1, A, 1, ReleaseReason.FINISHED.ordinal());
            t.onPageEvent(PROTECT_DONE, 1, 1, A, Owners.NOBODY, level.ordinal());
            t.onPageEvent(FREE, 1, 1, -1, Owners.NOBODY, 0);
            t.requestFinished(A, 1, RequestOutcome.COMPLETED);
            ev(t, ALLOCATE, 1, 1, B, 2, 0);
            ev(t, WRITE, 1, 1, B, 2, slots(0, FULL)); // NOTE: the engine's forward writes what it was handed
            t.requestFinished(B, 2, RequestOutcome.COMPLETED);
            t.onStepBoundary(1);
        }
        return AuditLog.read(List.of(where));
    }

    /**
     * A trail without reads (an engine whose kernels read KV outside the pool): a page another tenant's data left in,
     * unscrubbed, names the request it was handed to, with the slots it received, in the live summary and the query
     * alike; scrubbed first, nobody. A trail with reads judges the same hand-out by reads alone: none, nobody exposed.
     */
    @Test
    void aTrailWithoutReadsNamesTheRequestHandedAnotherTenantsUnscrubbedPage() throws IOException {
        List<AuditLog.Line> none = handedOver("none", false, ProtectionLevel.NONE);
        ExposureQuery.Report r = ExposureQuery.run(none, Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(Map.of("bob/2", Set.of("alice")), exposedBy(r));
        assertEquals(3, r.exposed().get(0).foreignSlotsReceived(), "alice wrote 3 of the page's 4 slots");
        assertEquals(List.of(2L), none.stream().filter(l -> l.type().equals("summary"))
                .filter(l -> Boolean.TRUE.equals(l.fields().get("exposed"))).map(l -> l.number("req", -1)).toList());
        assertTrue(none.stream().anyMatch(l -> l.type().equals("allocate") && Boolean.TRUE.equals(l.fields().get("exposed"))));
        assertEquals(Map.of(), exposedBy(ExposureQuery.run(handedOver("zero", false, ProtectionLevel.ZERO), Long.MIN_VALUE,
                Long.MAX_VALUE)));
        assertEquals(Map.of(), exposedBy(ExposureQuery.run(handedOver("reads", true, ProtectionLevel.NONE), Long.MIN_VALUE,
                Long.MAX_VALUE)));
    }

    @Test
    void theGoldenTrailsReplayWithEveryRecordRead() throws IOException {
        Path v2 = dir.resolve("v2");
        GoldenTrail.write(AuditSink.rotatingFiles(v2, "audit", GoldenTrail.MAX_FILE_BYTES), GoldenTrail.key(dir));
        ExposureQuery.Report r2 = ExposureQuery.run(AuditLog.read(List.of(v2)), Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(0, r2.unparsedLines());
        assertEquals(List.of(7L, 10L), r2.exposed().stream().map(ExposureQuery.Exposure::request).toList(),
                "request 10 read page 2's slots 2 and 3, never written");
        assertEquals(List.of(3L, 3L, 3L, 3L, 3L, -1L), r2.blocked().stream().map(ExposureQuery.Blocked::page).toList());
        assertEquals(0, AuditTool.run(new String[] {"exposure", v2.toString()}, new PrintStream(new ByteArrayOutputStream()),
                new PrintStream(new ByteArrayOutputStream())), "a level written as a number (no name for it) is read back");

        Path v1 = dir.resolve("v1");
        java.nio.file.Files.createDirectories(v1);
        try (var in = ExposureQueryTest.class.getResourceAsStream("golden-trail-v1.jsonl")) {
            java.nio.file.Files.write(v1.resolve("audit-000001.jsonl"), in.readAllBytes());
        }
        ExposureQuery.Report r = ExposureQuery.run(AuditLog.read(List.of(v1)), Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(0, r.unparsedLines());
        assertEquals(List.of(7L), r.exposed().stream().map(ExposureQuery.Exposure::request).toList());
        assertEquals(List.of(3L, 3L, 3L, 3L, 3L, -1L), r.blocked().stream().map(ExposureQuery.Blocked::page).toList(),
                "five rejections of page 3 and one of a malformed handle (format 1 wrote no page for it)");
    }

    @Test
    void correctPoolWorkloadShowsNoExposure() throws IOException {
        ExposureQuery.Report r = ExposureQuery.run(scripted("clean", false), Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(List.of(), r.exposed());
        assertEquals(List.of(), r.blocked());
    }

    @Test
    void timeWindowSelectsExposuresByWhenTheyHappened() throws IOException {
        List<AuditLog.Line> lines = scripted("window", true);
        long lastWall = lines.stream().mapToLong(l -> l.number("wall", 0)).max().orElseThrow();
        assertEquals(3, ExposureQuery.run(lines, Long.MIN_VALUE, lastWall).exposed().size());
        assertEquals(0, ExposureQuery.run(lines, lastWall + 1, Long.MAX_VALUE).exposed().size());
    }

    @Test
    void realPoolMisuseShowsOnlyAsBlockedAttempts() throws IOException {
        Path where = dir.resolve("real");
        try (TestPools p = TestPools.create(9, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            AuditTrail trail = AuditTrail.attach(p.pool, AuditFixtures.config(where, AuditKeys.generateInMemory(), 1 << 20).build());
            int a = p.pool.tenants().register("alice");
            int b = p.pool.tenants().register("bob");
            long ra = Owners.request(1);
            long rb = Owners.request(2);
            long[] ha = new long[1];
            long[] hb = new long[1];
            p.pool.allocate(a, ra, LeaseKind.OWNER, 1, ha, 0);
            int pageA = p.pool.view().pageOf(ha[0]);
            MemorySegment secret = Patterns.fill(arena, 4L * AuditFixtures.TOKEN_BYTES, a, 1, pageA, 0);
            p.pool.write(a, ra, ha[0], 0, 0, secret);
            MemorySegment got = arena.allocate(secret.byteSize());
            // bob presents alice's handle: foreign
            assertThrows(ForeignLeaseException.class, () -> p.pool.read(b, rb, ha[0], 0, 0, got));
            assertTrue(Patterns.allZero(got), "nothing moved on a rejected read");
            p.pool.allocate(b, rb, LeaseKind.OWNER, 1, hb, 0);
            // bob reads a slot he never wrote: read-before-write
            assertThrows(ReadBeforeWriteException.class, () -> p.pool.read(b, rb, hb[0], 0, 0, got));
            long stale = ha[0];
            p.pool.release(a, ra, ha, 0, 1, ReleaseReason.FINISHED);
            assertThrows(ReleasedLeaseException.class, () -> p.pool.release(a, ra, new long[] {stale}, 0, 1, ReleaseReason.FINISHED));
            p.pool.endStep();
            p.pool.allocate(b, rb, LeaseKind.OWNER, 1, ha, 0);
            assertEquals(pageA, p.pool.view().pageOf(ha[0]), "bob gets alice's page next, at a new generation");
            // alice's late use of her stale handle
            assertThrows(ReleasedLeaseException.class, () -> p.pool.read(a, ra, stale, 0, 0, got));
            p.pool.write(b, rb, ha[0], 0, 0, Patterns.fill(arena, secret.byteSize(), b, 2, pageA, 0));
            p.pool.read(b, rb, ha[0], 0, 0, got);
            assertTrue(Patterns.matches(got, b, 2, pageA, 0), "bob reads exactly what he wrote");
            trail.requestFinished(a, 1, RequestOutcome.COMPLETED);
            trail.requestFinished(b, 2, RequestOutcome.COMPLETED);
            p.pool.endStep();
            trail.close();
        }
        ExposureQuery.Report r = ExposureQuery.run(AuditLog.read(List.of(where)), Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(List.of(), r.exposed());
        assertEquals(List.of("reject_foreign/bob/2", "reject_read_before_write/bob/2", "reject_double_free/alice/1",
                "reject_double_free/alice/1"), r.blocked().stream().map(x -> x.type() + "/" + x.tenant() + "/" + x.request()).toList());

        ByteArrayOutputStream out = new ByteArrayOutputStream();
        assertEquals(0, AuditTool.run(new String[] {"exposure", "--json", where.toString()}, new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(new ByteArrayOutputStream())));
        Map<String, Object> doc = Json.parseObject(out.toString(StandardCharsets.UTF_8).strip());
        assertEquals(List.of(), doc.get("exposed"));
        assertEquals(4, ((List<?>) doc.get("blocked")).size());
    }

    @Test
    void sharedNamespaceReadsAreSharingNotExposureAndRegulatedReadersAreBlocked() throws IOException {
        Path where = dir.resolve("shared");
        try (TestPools p = TestPools.create(9, ProtectionLevel.ZERO); Arena arena = Arena.ofConfined()) {
            AuditTrail trail = AuditTrail.attach(p.pool, AuditFixtures.config(where, AuditKeys.generateInMemory(), 1 << 20).build());
            int operator = p.pool.tenants().register("public-prompts");
            int bob = p.pool.tenants().register("bob");
            int bank = p.pool.tenants().register("bank", dev.kvshield.tenant.TenantPolicy.regulatedTenant());
            p.pool.declareSharedNamespace(operator);
            long ns = Owners.namespace(1);
            long[] h = new long[1];
            p.pool.allocate(operator, ns, LeaseKind.NAMESPACE, 1, h, 0);
            int page = p.pool.view().pageOf(h[0]);
            MemorySegment prompt = Patterns.fill(arena, 4L * AuditFixtures.TOKEN_BYTES, operator, 1, page, 0);
            p.pool.write(operator, ns, h[0], 0, 0, prompt);
            long reader = Leases.addReader(p.pool, operator, ns, h[0], bob, Owners.request(2));
            MemorySegment got = arena.allocate(prompt.byteSize());
            p.pool.read(bob, Owners.request(2), reader, 0, 0, got);
            assertTrue(Patterns.matches(got, operator, 1, page, 0), "bob reads the shared prompt");
            assertThrows(ForeignAccessException.class, () -> Leases.addReader(p.pool, operator, ns, h[0], bank, Owners.request(3)));
            trail.requestFinished(bob, 2, RequestOutcome.COMPLETED);
            trail.requestFinished(bank, 3, RequestOutcome.COMPLETED);
            p.pool.endStep();
            trail.close();
        }
        List<AuditLog.Line> lines = AuditLog.read(List.of(where));
        ExposureQuery.Report r = ExposureQuery.run(lines, Long.MIN_VALUE, Long.MAX_VALUE);
        assertEquals(List.of(), r.exposed());
        assertEquals(List.of("reject_foreign/bank/3"), r.blocked().stream().map(x -> x.type() + "/" + x.tenant() + "/" + x.request()).toList());
        AuditLog.Line bobSummary = lines.stream().filter(l -> l.type().equals("summary") && l.number("req", -1) == 2).findFirst().orElseThrow();
        assertEquals(List.of(0L), bobSummary.fields().get("sharedFrom"));

        // Planted-bug twin: the same read without the grant (a pool that skipped its reader check) is exposure.
        Path bug = dir.resolve("ungranted");
        try (AuditTrail t = scriptedTrail(bug)) {
            ev(t, ALLOCATE, 1, 0, A, 1, 0);
            ev(t, WRITE, 1, 0, A, 1, slots(0, FULL));
            ev(t, READ, 1, 0, B, 2, slots(0, FULL));
            t.requestFinished(B, 2, RequestOutcome.COMPLETED);
        }
        assertEquals(Map.of("bob/2", Set.of("alice")), exposedBy(ExposureQuery.run(AuditLog.read(List.of(bug)), Long.MIN_VALUE, Long.MAX_VALUE)));
    }
}
