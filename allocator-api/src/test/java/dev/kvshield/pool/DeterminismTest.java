package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.TestPools;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Deque;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.locks.LockSupport;
import java.util.function.UnaryOperator;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Tensor-parallel ranks must decide identically: two pools fed the same calls and step boundaries,
 * one protecting synchronously, one on a worker slowed at random, report the same availability and
 * hand out the same pages at every step.
 */
class DeterminismTest {
    /** A backend whose scrubs take a random 0-300 µs on the worker thread. */
    static PageMemory randomlySlow(PageMemory delegate, long seed) {
        SplittableRandom delays = new SplittableRandom(seed);
        return new ForwardingPageMemory(delegate) {
            @Override
            public void scrub(int[] pages, int offset, int count) {
                long nanos;
                synchronized (delays) {
                    nanos = delays.nextLong(300_000);
                }
                LockSupport.parkNanos(nanos);
                super.scrub(pages, offset, count);
            }
        };
    }

    record Owner(int tenant, long request, long[] handles, List<Long> claims) {}

    @ParameterizedTest
    @ValueSource(longs = {1L, 7L, 20261202L})
    void syncAndDelayedAsyncPoolsDecideIdentically(long seed) {
        int pages = 24;
        try (TestPools sync = TestPools.create(TestPools.tinyGeometry(pages), ProtectionLevel.ZERO, UnaryOperator.identity(),
                UnaryOperator.identity());
                TestPools async = TestPools.create(TestPools.tinyGeometry(pages), ProtectionLevel.ZERO,
                        c -> c.quarantineMode(QuarantineMode.ASYNCHRONOUS), m -> randomlySlow(m, seed))) {
            KvPagePool[] ranks = {sync.pool, async.pool};
            for (KvPagePool p : ranks) {
                p.tenants().register("t0");
                p.tenants().register("t1");
            }
            SplittableRandom random = new SplittableRandom(seed);
            Deque<Owner> live = new ArrayDeque<>();
            long request = 0;
            for (int step = 0; step < 300; step++) {
                int ops = 1 + random.nextInt(4);
                for (int op = 0; op < ops; op++) {
                    int kind = random.nextInt(10);
                    if (kind < 5) {
                        int tenant = random.nextInt(2);
                        int n = 1 + random.nextInt(5);
                        long r = request++;
                        long[][] out = {new long[n], new long[n]};
                        boolean[] ok = new boolean[2];
                        for (int k = 0; k < 2; k++) {
                            ok[k] = ranks[k].allocate(tenant, Owners.request(r), LeaseKind.OWNER, n, out[k], 0);
                        }
                        assertEquals(ok[0], ok[1], "seed " + seed + " step " + step + ": allocate answered differently");
                        assertArrayEquals(out[0], out[1], "seed " + seed + " step " + step + ": different pages handed out");
                        if (ok[0]) {
                            List<Long> claims = new ArrayList<>();
                            if (random.nextInt(4) == 0) {
                                for (KvPagePool p : ranks) {
                                    claims.add(Leases.claim(p, tenant, Owners.request(r), out[0][0], ClaimKind.WRITER, r));
                                }
                            }
                            live.add(new Owner(tenant, r, out[0], claims));
                        }
                    } else if (kind < 9 && !live.isEmpty()) {
                        Owner o = random.nextBoolean() ? live.pollFirst() : live.pollLast();
                        for (KvPagePool p : ranks) {
                            p.release(o.tenant(), Owners.request(o.request()), o.handles(), 0, o.handles().length, ReleaseReason.FINISHED);
                        }
                        if (!o.claims().isEmpty()) {
                            for (int k = 0; k < 2; k++) {
                                Leases.dropClaims(ranks[k], new long[] {o.claims().get(k)}, 0, 1);
                            }
                        }
                    }
                }
                int[] made = {ranks[0].endStep(), ranks[1].endStep()};
                assertEquals(made[0], made[1], "seed " + seed + " step " + step);
                assertEquals(ranks[0].available(), ranks[1].available(), "seed " + seed + " step " + step);
                assertEquals(ranks[0].snapshot().free(), ranks[1].snapshot().free(), "seed " + seed + " step " + step + " "
                        + Arrays.toString(made));
            }
        }
    }
}
