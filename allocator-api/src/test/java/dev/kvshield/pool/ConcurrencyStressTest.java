package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.UnaryOperator;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Real threads, one tenant each, allocating, checking that what they got reads zero, writing
 * their pattern, reading it back, releasing, and passing step boundaries — bounded to 1.5 s and
 * 4000 iterations per thread. Any zero-after-release or read-back violation is a failure.
 */
class ConcurrencyStressTest {
    @ParameterizedTest
    @EnumSource(QuarantineMode.class)
    void threadsNeverSeeEachOthersBytes(QuarantineMode mode) throws Exception {
        PoolGeometry g = PoolGeometry.builder().mha(2, 1, 8, 2).pageSizeTokens(4).pageCount(33).build();
        try (TestPools t = TestPools.create(g, ProtectionLevel.ZERO, c -> c.quarantineMode(mode), UnaryOperator.identity())) {
            KvPagePool pool = t.pool;
            int threads = 4;
            for (int i = 0; i < threads; i++) {
                pool.tenants().register("t" + i);
            }
            ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
            AtomicLong iterations = new AtomicLong();
            long deadline = System.nanoTime() + 1_500_000_000L;
            List<Thread> workers = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                int tenant = i;
                workers.add(Thread.ofPlatform().start(() -> {
                    SplittableRandom random = new SplittableRandom(1000 + tenant);
                    try (Arena arena = Arena.ofConfined()) {
                        long pageBytes = g.pageBytes(0);
                        MemorySegment got = arena.allocate(pageBytes);
                        for (int it = 0; it < 4000 && System.nanoTime() < deadline; it++) {
                            long request = (long) tenant << 32 | it;
                            int n = 1 + random.nextInt(4);
                            long[] h = new long[n];
                            if (!pool.allocate(tenant, Owners.request(request), LeaseKind.OWNER, n, h, 0)) {
                                pool.endStep();
                                continue;
                            }
                            for (long handle : h) {
                                int page = pool.view().pageOf(handle);
                                for (int b = 0; b < g.bufferCount(); b++) {
                                    t.memory.read(page, b, 0, got);
                                    if (!Patterns.allZero(got)) {
                                        violations.add("tenant " + tenant + " got non-zero page " + page + " buffer " + b);
                                    }
                                    pool.write(tenant, Owners.request(request), handle, b, 0,
                                            Patterns.fill(arena, pageBytes, tenant, request, page, b));
                                }
                            }
                            for (long handle : h) {
                                int page = pool.view().pageOf(handle);
                                for (int b = 0; b < g.bufferCount(); b++) {
                                    pool.read(tenant, Owners.request(request), handle, b, 0, got);
                                    if (!Patterns.matches(got, tenant, request, page, b)) {
                                        violations.add("tenant " + tenant + " read back foreign bytes on page " + page);
                                    }
                                }
                            }
                            pool.release(tenant, Owners.request(request), h, 0, n, ReleaseReason.FINISHED);
                            if (random.nextInt(3) == 0) {
                                pool.endStep();
                            }
                            iterations.incrementAndGet();
                        }
                    } catch (Throwable e) {
                        violations.add("tenant " + tenant + " failed: " + e);
                    }
                }));
            }
            for (Thread w : workers) {
                w.join();
            }
            assertTrue(violations.isEmpty(), violations.stream().limit(5).toList().toString());
            assertTrue(iterations.get() > 100, "too few iterations to mean anything: " + iterations.get());
            pool.endStep();
            PoolSnapshot s = pool.snapshot();
            assertEquals(0, s.owned());
            assertEquals(32, s.free() + s.quarantined());
        }
    }
}
