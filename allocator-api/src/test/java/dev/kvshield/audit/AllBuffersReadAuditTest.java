package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The audit answers about a request do not depend on whether it read a page one buffer at a time
 * ({@code READ} per buffer, listed with {@code times}) or all buffers in one call ({@code READ}
 * once per page): the same pages read with their generations, the same exposure verdict and
 * sources, for a clean pool and for a planted cross-tenant read.
 */
class AllBuffersReadAuditTest {
    @TempDir
    Path dir;

    private static AuditLog.Line summaryOf(List<AuditLog.Line> lines, long request) {
        return lines.stream().filter(l -> l.type().equals("summary") && l.number("req", -1) == request).findFirst().orElseThrow();
    }

    /** The answer fields a reader relies on: pages read (page, gen), exposure verdict, sources, shared namespaces. */
    private static List<Object> answer(AuditLog.Line summary) {
        Map<String, Object> f = summary.fields();
        return List.of(f.get("pagesRead"), f.get("exposed"), f.get("sources"), f.get("sharedFrom"), f.get("rejections"));
    }

    @Test
    void aRequestReadingAllBuffersAtOnceGetsTheSameSummaryAsOneReadingThemOneByOne() throws IOException {
        Path where = dir.resolve("pool");
        try (TestPools t = TestPools.create(5, ProtectionLevel.COMPLIANCE); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            AuditKeys.SigningKey key = AuditKeys.generateInMemory();
            AuditTrail trail = AuditTrail.attach(pool, AuditFixtures.config(where, key, 1 << 20).build());
            int a = pool.tenants().register("alice");
            int buffers = pool.geometry().bufferCount();
            for (long request = 1; request <= 2; request++) {
                long owner = Owners.request(request);
                long[] h = new long[2];
                assertTrue(pool.allocate(a, owner, LeaseKind.OWNER, 2, h, 0));
                for (long lease : h) {
                    int page = pool.view().pageOf(lease);
                    MemorySegment[] src = new MemorySegment[buffers];
                    MemorySegment[] dst = new MemorySegment[buffers];
                    for (int b = 0; b < buffers; b++) {
                        src[b] = Patterns.fill(arena, 4L * pool.geometry().bytesPerToken(b), a, request, page, b);
                        dst[b] = arena.allocate(src[b].byteSize());
                    }
                    pool.writeAllBuffers(a, owner, lease, 0, src);
                    if (request == 1) {
                        for (int b = 0; b < buffers; b++) {
                            pool.read(a, owner, lease, b, 0, dst[b]);
                        }
                    } else {
                        pool.readAllBuffers(a, owner, lease, 0, dst);
                    }
                    for (int b = 0; b < buffers; b++) {
                        assertTrue(Patterns.matches(dst[b], a, request, page, b), "request " + request + " page " + page + " buffer " + b);
                    }
                }
                pool.endStep();
                pool.release(a, owner, h, 0, 2, ReleaseReason.FINISHED);
                trail.requestFinished(a, request, RequestOutcome.COMPLETED);
                pool.endStep();
            }
            trail.close();
            List<AuditLog.Line> lines = AuditLog.read(List.of(where));
            List<AuditLog.Line> reads = lines.stream().filter(l -> l.type().equals("read")).toList();
            assertEquals(List.of((long) buffers, (long) buffers, 1L, 1L),
                    reads.stream().flatMap(l -> l.pages().stream()).map(AuditLog.PageEntry::times).toList(),
                    "one READ per buffer and page, then one per page");
            AuditLog.Line one = summaryOf(lines, 1);
            AuditLog.Line all = summaryOf(lines, 2);
            assertEquals(2, ((List<?>) all.fields().get("pagesRead")).size());
            assertEquals(answer(one).subList(1, 5), answer(all).subList(1, 5));
            assertEquals(Boolean.FALSE, all.fields().get("exposed"));
            assertEquals(List.of(), ExposureQuery.run(lines, Long.MIN_VALUE, Long.MAX_VALUE).exposed());
            AuditVerifier.Report r = AuditVerifier.verify(List.of(where), key.publicKey());
            assertTrue(r.ok(), () -> r.problems().toString());
        }
    }

    /**
     * Twin with a planted isolation bug (a replayed trail in which bob's request reads alice's
     * page): read per buffer or all at once, the summary and {@code audit exposure} name the same
     * exposure, pages and source.
     */
    @Test
    void aPlantedForeignReadIsTheSameExposureEitherWay() throws IOException {
        int buffers = 4;
        for (boolean allAtOnce : new boolean[] {false, true}) {
            Path where = dir.resolve("replay-" + allAtOnce);
            AuditKeys.SigningKey key = AuditKeys.generateInMemory();
            AuditTrail trail = AuditTrail.detached(AuditConfig.builder().sink(AuditSink.rotatingFiles(where, "audit", 1 << 20))
                    .signingKey(key).build(), new AuditTrail.Scope("replay", 0, 4, 4, ProtectionLevel.ZERO, t -> t == 0 ? "alice" : "bob"));
            long alice = Owners.request(1);
            long bob = Owners.request(2);
            trail.onPageEvent(PageEventType.ALLOCATE, 1, 1, 0, alice, 0);
            trail.onPageEvent(PageEventType.WRITE, 1, 1, 0, alice, 4);
            for (int b = 0; b < (allAtOnce ? 1 : buffers); b++) {
                trail.onPageEvent(PageEventType.READ, 1, 1, 1, bob, 4);
            }
            trail.requestFinished(1, 2, RequestOutcome.COMPLETED);
            trail.onStepBoundary(1);
            trail.close();
            List<AuditLog.Line> lines = AuditLog.read(List.of(where));
            AuditLog.Line summary = summaryOf(lines, 2);
            assertEquals(List.of(List.of(List.of(1L, 1L)), Boolean.TRUE, List.of(0L), List.of(), 0L), answer(summary), "all at once: " + allAtOnce);
            List<ExposureQuery.Exposure> exposed = ExposureQuery.run(lines, Long.MIN_VALUE, Long.MAX_VALUE).exposed();
            assertEquals(1, exposed.size(), "all at once: " + allAtOnce);
            assertEquals(List.of("alice"), exposed.getFirst().sourceTenants());
            assertEquals(2, exposed.getFirst().request());
        }
    }
}
