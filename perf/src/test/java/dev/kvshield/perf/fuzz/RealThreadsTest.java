package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Canary;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * The fuzzer's actors on real threads, bounded to one second: four request threads (one tenant
 * each, local requests and handoffs through one shared sender and receiver, cancels mid-transfer)
 * and a step-boundary thread drive one small pool with asynchronous protection. Every read-back
 * must be the request's own canary, byte for byte.
 */
class RealThreadsTest {
    static final int THREADS = 4;
    static final long BUDGET_NANOS = 1_000_000_000L;

    @Test
    void concurrentRequestsReadBackOnlyTheirOwnBytes() throws Exception {
        PoolGeometry g = TraceRunner.geometry(17);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO)
                        .quarantineMode(QuarantineMode.ASYNCHRONOUS).admission(new AdmissionPolicy(g.capacityTokens(), 0, false))
                        .build(), memory)) {
            HandoffSender sender = new HandoffSender(pool);
            HandoffReceiver receiver = new HandoffReceiver(pool, alarm -> { });
            sender.handshake(TraceRunner.DECODE_PEER, receiver.effectiveLimitTokens());
            receiver.handshake(TraceRunner.PREFILL_PEER, sender.effectiveLimitTokens());
            for (int t = 0; t < THREADS; t++) {
                pool.tenants().register("t" + t);
            }
            ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
            AtomicLong readBack = new AtomicLong();
            long deadline = System.nanoTime() + BUDGET_NANOS;
            List<Thread> threads = new ArrayList<>();
            for (int t = 0; t < THREADS; t++) {
                int tenant = t;
                threads.add(Thread.ofPlatform().start(() -> {
                    try {
                        requests(pool, sender, receiver, tenant, deadline, readBack);
                    } catch (Throwable x) {
                        violations.add("tenant " + tenant + ": " + x);
                    }
                }));
            }
            threads.add(Thread.ofPlatform().start(() -> {
                while (System.nanoTime() < deadline) {
                    pool.endStep();
                    Thread.onSpinWait();
                }
            }));
            for (Thread th : threads) {
                th.join();
            }
            assertEquals(List.of(), List.copyOf(violations));
            assertTrue(readBack.get() > 20, "requests read back: " + readBack.get());
            for (int i = 0; i < 4; i++) {
                pool.endStep();
            }
            assertEquals(0, pool.snapshot().owned());
            assertEquals(0, pool.snapshot().quarantined(), pool.snapshot().toString());
        }
    }

    private static void requests(KvPagePool pool, HandoffSender sender, HandoffReceiver receiver, int tenant, long deadline,
            AtomicLong readBack) {
        SplittableRandom rnd = new SplittableRandom(77 + tenant);
        PoolGeometry g = pool.geometry();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment page = arena.allocate(FuzzTrace.PAGE_TOKENS * 16L);
            MemorySegment want = arena.allocate(FuzzTrace.PAGE_TOKENS * 16L);
            for (long request = (long) tenant << 32; System.nanoTime() < deadline; request++) {
                int pages = 1 + rnd.nextInt(3);
                int tokens = pages * FuzzTrace.PAGE_TOKENS;
                long owner = Owners.request(request);
                long[] h = new long[pages];
                if (!pool.allocate(tenant, owner, LeaseKind.OWNER, pages, h, 0)) {
                    Thread.yield();
                    continue;
                }
                for (int p = 0; p < pages; p++) {
                    for (int b = 0; b < g.bufferCount(); b++) {
                        Canary.fill(page, tenant, request, p * FuzzTrace.PAGE_TOKENS, FuzzTrace.PAGE_TOKENS, b, 16);
                        pool.write(tenant, owner, h[p], b, 0, page);
                    }
                }
                long[] decode = h;
                if (rnd.nextBoolean()) {
                    HandoffSender.Transfer t = sender.begin(tenant, request, tokens, h, TraceRunner.DECODE_PEER);
                    Reservation r = receiver.reserve(tenant, request, tokens, TraceRunner.PREFILL_PEER);
                    if (r == null) {
                        sender.complete(t);
                        pool.release(tenant, owner, h, 0, pages, ReleaseReason.ABORTED);
                        continue;
                    }
                    boolean cancel = rnd.nextInt(4) == 0;
                    for (int p = 0; p < pages; p++) {
                        if (cancel && p == pages / 2) {
                            receiver.abort(r); // the transport keeps landing: the pages stay claimed
                        }
                        for (int b = 0; b < g.bufferCount(); b++) {
                            sender.read(t, p, b, 0, page);
                            pool.memory().write(r.page(p), b, 0, page);
                        }
                        if (!cancel || p < pages / 2) {
                            receiver.recordWritten(r, p, 0, FuzzTrace.PAGE_TOKENS);
                        }
                    }
                    CommitResult c = cancel ? null : receiver.commit(r, tokens);
                    sender.complete(t);
                    receiver.acknowledge(r);
                    pool.release(tenant, owner, h, 0, pages, ReleaseReason.FINISHED);
                    if (c == null || !c.committed()) {
                        continue;
                    }
                    decode = new long[pages];
                    for (int p = 0; p < pages; p++) {
                        decode[p] = r.lease(p);
                    }
                }
                for (int p = 0; p < pages; p++) {
                    for (int b = 0; b < g.bufferCount(); b++) {
                        pool.read(tenant, owner, decode[p], b, 0, page);
                        Canary.fill(want, tenant, request, p * FuzzTrace.PAGE_TOKENS, FuzzTrace.PAGE_TOKENS, b, 16);
                        if (page.mismatch(want) >= 0) {
                            throw new AssertionError("request " + request + " page " + pool.view().pageOf(decode[p])
                                    + " read back bytes that are not its own");
                        }
                    }
                }
                readBack.incrementAndGet();
                pool.release(tenant, owner, decode, 0, pages, ReleaseReason.FINISHED);
            }
        }
    }
}
