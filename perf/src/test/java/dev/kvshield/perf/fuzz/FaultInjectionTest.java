package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolSnapshot;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * Faults in the protection path under fuzzed traces: while a fault lasts the pool must keep every
 * invariant the oracles check (no page handed out unprotected, no request reads another's bytes),
 * count the failure, and recover once the fault clears (the drain ends with nothing owned or
 * quarantined). Each fault clears after a fixed number of failures per run.
 */
class FaultInjectionTest {
    static final long SEED = 9;
    static final int TRACES = 80;
    static final int FAILURES_PER_RUN = 3;

    /** The backend scrubs half a batch, then throws (a kernel that faulted mid-launch). */
    static Rig midBatchBackendError() {
        return memoryRig(base -> new ForwardingPageMemory(base) {
            private int calls;
            private int failures;

            @Override
            public void scrub(int[] pages, int offset, int count) {
                if (calls++ > 0 && calls % 2 == 0 && failures < FAILURES_PER_RUN) {
                    failures++;
                    super.scrub(pages, offset, count / 2);
                    throw new IllegalStateException("injected backend fault after " + count / 2 + " of " + count + " pages");
                }
                super.scrub(pages, offset, count);
            }
        });
    }

    /**
     * A worker-killing error inside the backend, on the protection worker's thread (the worker must
     * survive it); the scheduler thread's own calls (start-up, the boundary's scrub of failed pages)
     * are not injected.
     */
    static Rig errorOnTheWorker() {
        return memoryRig(base -> new ForwardingPageMemory(base) {
            private final Thread scheduler = Thread.currentThread();
            private int failures;

            @Override
            public void scrub(int[] pages, int offset, int count) {
                if (Thread.currentThread() != scheduler && failures < FAILURES_PER_RUN) {
                    failures++;
                    throw new OutOfMemoryError("injected: an error on the protection worker");
                }
                super.scrub(pages, offset, count);
            }
        });
    }

    /** Verification finds a non-zero byte on the first page of a batch (COMPLIANCE): the page must be retired. */
    static Rig verifyFailure() {
        return memoryRig(base -> new ForwardingPageMemory(base) {
            private int calls;
            private int failures;

            @Override
            public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
                if (calls++ > 0 && failures < FAILURES_PER_RUN && count > 0) {
                    failures++;
                    dirtyOut[0] = pages[offset];
                    return 1;
                }
                return super.verifyZero(pages, offset, count, dirtyOut);
            }
        });
    }

    private static Rig memoryRig(java.util.function.UnaryOperator<PageMemory> wrap) {
        return new Rig() {
            @Override
            public PageMemory memory(PageMemory base) {
                return wrap.apply(base);
            }
        };
    }

    /** The key source is unavailable for the pool's first few seals (ENCRYPT): the retry zeroes instead. */
    static PageSealerFactory keySourceUnavailable(PageSealerFactory delegate) {
        return context -> {
            PageSealer sealer = delegate.create(context);
            return new PageSealer() {
                private int failures;

                @Override
                public boolean canSeal(int tenant) {
                    return sealer.canSeal(tenant);
                }

                @Override
                public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
                    if (failures < FAILURES_PER_RUN) {
                        failures++;
                        throw new IllegalStateException("injected: key source unavailable");
                    }
                    return sealer.seal(tenant, pages, generations, offset, count);
                }

                @Override
                public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                    sealer.unseal(tenant, epoch, pages, generations, offset, count);
                }

                @Override
                public boolean isEpochAvailable(int tenant, int epoch) {
                    return sealer.isEpochAvailable(tenant, epoch);
                }

                @Override
                public void shred(int tenant) {
                    sealer.shred(tenant);
                }

                @Override
                public void close() {
                    sealer.close();
                }
            };
        };
    }

    @Test
    void backendErrorMidBatch() {
        for (QuarantineMode mode : QuarantineMode.values()) {
            campaign(FuzzFixtures.fuzzer(FaultInjectionTest::midBatchBackendError), ProtectionLevel.ZERO, mode);
        }
    }

    @Test
    void anErrorOnTheProtectionWorker() {
        campaign(FuzzFixtures.fuzzer(FaultInjectionTest::errorOnTheWorker), ProtectionLevel.ZERO, QuarantineMode.ASYNCHRONOUS);
    }

    @Test
    void verifyFailureRetiresThePage() {
        campaign(FuzzFixtures.fuzzer(FaultInjectionTest::verifyFailure), ProtectionLevel.COMPLIANCE, QuarantineMode.SYNCHRONOUS);
    }

    @Test
    void keySourceUnavailable() {
        TraceRunner runner = new TraceRunner(keySourceUnavailable(Sealers.hostSealer().value()));
        campaign(new Fuzzer(runner, () -> Rig.CLEAN), ProtectionLevel.ENCRYPT, QuarantineMode.SYNCHRONOUS);
    }

    private static void campaign(Fuzzer fuzzer, ProtectionLevel level, QuarantineMode mode) {
        TraceGenerator generator = TraceGenerator.fixed(level, mode);
        long failures = 0;
        for (int i = 0; i < TRACES; i++) {
            FuzzTrace trace = generator.generate(Campaign.traceSeed(SEED, i));
            Fuzzer.Check c = fuzzer.check(trace);
            assertEquals(List.of(), c.findings(), level + " " + mode + ", trace seed " + Campaign.traceSeed(SEED, i));
            failures += c.result().protectionFailures();
        }
        assertTrue(failures > 0, "the injected faults were counted by the pool's metrics (" + level + " " + mode + ")");
    }

    /**
     * Fault injection without its fault: the same campaigns, without the faults traces arm themselves
     * ({@code fault K}), count no failure (so the counts above come from the faults).
     */
    @Test
    void withoutTheFaultNothingIsCounted() {
        long failures = 0;
        for (int i = 0; i < 20; i++) {
            FuzzTrace t = TraceGenerator.fixed(ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS).generate(Campaign.traceSeed(SEED, i));
            failures += FuzzFixtures.RUNNER.run(EpochRaceTest.withoutFaults(t), Rig.CLEAN).protectionFailures();
        }
        assertEquals(0, failures);
    }

    /**
     * Exhaustion with a quarantine backlog: every page released by aborted requests whose transfers
     * still hold claims. Allocation answers "none" naming the counts, never hands out a claimed or
     * unprotected page, and succeeds once the claims drain.
     */
    @Test
    void exhaustionWithAClaimedBacklogAnswersNoneWithTheCounts() {
        try (TestPools t = TestPools.create(TraceRunner.geometry(5), ProtectionLevel.ZERO,
                c -> c.quarantineMode(QuarantineMode.ASYNCHRONOUS), m -> m); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] pages = new long[4];
            long[] claims = new long[4];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 4, pages, 0));
            pool.claim(a, Owners.request(1), pages, 0, 4, ClaimKind.WRITER, 7, claims, 0);
            for (long lease : pages) {
                PoolProbe.fillPage(t.memory, arena, pool.view().pageOf(lease), a, 1); // the transfer landed tenant a's KV
            }
            pool.release(a, Owners.request(1), pages, 0, 4, ReleaseReason.ABORTED);
            pool.endStep();
            long[] out = new long[1];
            assertFalse(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, out, 0), "every page is quarantined behind a live claim");
            String why = pool.lastShortfall();
            assertTrue(why.contains("pool exhausted") && why.contains("tenant " + b), why);
            PoolSnapshot s = pool.snapshot();
            assertEquals(4, s.quarantined());
            assertEquals(4, s.claimedPages());
            assertTrue(why.contains(s.toString()), "the shortfall names the counts: " + why);
            pool.dropClaims(a, Owners.request(1), claims, 0, 4);
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, out, 0),
                    "once the claims drain the pages are protected and handed out");
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(out[0]))), "handed out scrubbed");
        }
    }
}
