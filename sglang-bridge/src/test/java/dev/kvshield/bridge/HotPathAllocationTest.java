package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The token path allocates nothing on the Java heap once warm: a scheduler step's boundary, hand-outs (planned
 * {@code alloc}, a batch's {@code alloc_extend} and {@code alloc_decode}), frees, free groups and request releases,
 * at NONE and ZERO, page size 1 and 4. Measured as this thread's allocated bytes over rounds of steps.
 *
 * <p>Implementation notes: the criterion is a round under one byte per step, within a bounded number of rounds (what
 * the JIT's own transitions leave on the thread is a few hundred bytes per thousands of steps; one object per step
 * is 16 bytes or more). These paths allocate nothing even interpreted, so the figure does not hang on the JIT's
 * escape analysis. ENCRYPT is not here: its host cipher's Vector API code boxes each vector until C2 has compiled it
 * ({@code ChaCha20}'s notes), which on a loaded machine can take longer than a test should wait; the GPU sealer
 * runs in the device. The planted twin (a listener that allocates per event) shows the measure sees a per-step
 * object.
 */
class HotPathAllocationTest {
    private static final int PAGES = 512;
    private static final int MAX_ROUNDS = 12;
    private static final int STEPS_PER_ROUND = 1_000;
    private static final int WARMUP_STEPS = 2_000;

    private static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();

    /** A scheduler over one allocator: eight requests of two tenants decoding, released and replaced in turn. */
    private static final class Scheduler implements AutoCloseable {
        private static final int BATCH = 8;
        private final OffHeapPageMemory memory;
        private final SlotAllocator allocator;
        private final LongBuffer io;
        private final LongBuffer plan;
        private final int page;
        private final int[] tenants = new int[2];
        private final long[] requests = new long[BATCH];
        private final long[] seqs = new long[BATCH];
        private long nextRequest = 1;
        private long step;

        Scheduler(String level, int pageSizeTokens) {
            PoolGeometry g = PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(pageSizeTokens).pageCount(PAGES).build();
            memory = OffHeapPageMemory.allocate(g);
            allocator = SlotAllocator.create(Map.of(BridgeSettings.LEVEL, level), g, memory);
            ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * pageSizeTokens * 8).order(ByteOrder.nativeOrder());
            ByteBuffer planBytes = ByteBuffer.allocateDirect(BATCH * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
            allocator.bind(ioBytes, planBytes);
            io = ioBytes.asLongBuffer();
            plan = planBytes.asLongBuffer();
            page = pageSizeTokens;
            tenants[0] = allocator.tenantId("acme");
            tenants[1] = allocator.tenantId("globex");
            for (int r = 0; r < BATCH; r++) {
                admit(r);
            }
        }

        private int tenantOf(int r) {
            return tenants[(int) (requests[r] & 1)];
        }

        /** A new request in row {@code r}: its prompt's pages by a planned {@code alloc} (page 1) or {@code alloc_extend}. */
        private void admit(int r) {
            requests[r] = nextRequest++;
            long prompt = page * (1 + requests[r] % 5);
            row(0, requests[r], tenantOf(r), 0, prompt);
            long got = page == 1 ? allocator.alloc(prompt, 1, 0) : allocator.allocExtend(1, prompt, 0);
            assertEquals(prompt, got);
            seqs[r] = prompt;
        }

        private void row(int r, long request, int tenant, long prefix, long seq) {
            int o = r * SlotAllocator.PLAN_ROW;
            plan.put(o, request);
            plan.put(o + 1, tenant);
            plan.put(o + 2, prefix);
            plan.put(o + 3, seq);
            plan.put(o + 4, -1);
        }

        /**
         * One step: the boundary, one decode token for every row (one planned hand-out for the batch), then one row
         * finishes: its request's release as SGLang runs it, in turn a whole release, its slots freed then its
         * leftovers, or its frees inside a free group.
         */
        void step() {
            allocator.endStep();
            for (int r = 0; r < BATCH; r++) {
                row(r, requests[r], tenantOf(r), seqs[r], seqs[r] + 1);
                seqs[r]++;
            }
            long got = page == 1 ? allocator.alloc(BATCH, BATCH, 0) : allocator.allocExtend(BATCH, BATCH, 0);
            assertEquals(BATCH, got);
            int r = (int) (step++ % BATCH);
            long request = requests[r];
            int tenant = tenantOf(r);
            int held = allocator.heldPages(request);
            for (int i = 0; i < held; i++) {
                io.put(i, (long) allocator.pageAt(request, i) * page);
            }
            switch ((int) (step % 3)) {
                case 0 -> assertEquals(0, allocator.releaseRequest(held, tenant, request, true, 0));
                case 1 -> {
                    assertEquals(0, allocator.free(held, tenant, request, 0));
                    assertEquals(0, allocator.releaseLeftovers(request, tenant, 0));
                }
                default -> {
                    assertEquals(0, allocator.free(held, tenant, request, SlotAllocator.IN_FREE_GROUP));
                    allocator.endFreeGroup(0);
                }
            }
            assertEquals(0, allocator.heldPages(request));
            admit(r);
        }

        /**
         * The bytes this thread allocated in the first round of {@link #STEPS_PER_ROUND} steps that allocated under a byte
         * per step, or the fewest of {@link #MAX_ROUNDS} rounds when none did.
         */
        long quietRoundBytes() {
            long least = Long.MAX_VALUE;
            for (int round = 0; round < MAX_ROUNDS && least >= STEPS_PER_ROUND; round++) {
                long before = THREADS.getCurrentThreadAllocatedBytes();
                for (int i = 0; i < STEPS_PER_ROUND; i++) {
                    step();
                }
                least = Math.min(least, THREADS.getCurrentThreadAllocatedBytes() - before);
            }
            return least;
        }

        @Override
        public void close() {
            allocator.close();
            memory.close();
        }
    }

    private static long warmQuietRoundBytes(Scheduler s) {
        assertTrue(THREADS.isThreadAllocatedMemorySupported(),
                "this JVM cannot count a thread's allocated bytes");
        THREADS.setThreadAllocatedMemoryEnabled(true);
        for (int i = 0; i < WARMUP_STEPS; i++) {
            s.step();
        }
        return s.quietRoundBytes();
    }

    @ParameterizedTest(name = "{0}, page size {1}")
    @CsvSource({"NONE, 1", "NONE, 4", "ZERO, 1", "ZERO, 4"})
    void aWarmStepAllocatesNothing(String level, int pageSizeTokens) {
        try (Scheduler s = new Scheduler(level, pageSizeTokens)) {
            long bytes = warmQuietRoundBytes(s);
            assertTrue(bytes < STEPS_PER_ROUND, level + ", page size " + pageSizeTokens + ": " + bytes + " bytes allocated in "
                    + STEPS_PER_ROUND + " steps (boundary, a batch's hand-out, a request's release)");
        }
    }

    /** The twin: a listener that keeps one object per event makes the same measure fail. */
    @ParameterizedTest(name = "{0}, page size {1}")
    @CsvSource({"NONE, 1", "ZERO, 4"})
    void theMeasureSeesAnObjectPerStep(String level, int pageSizeTokens) {
        try (Scheduler s = new Scheduler(level, pageSizeTokens)) {
            List<long[]> kept = new ArrayList<>();
            s.allocator.pool().addListener(new PageEventListener() {
                @Override
                public void onPageEvent(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
                    if (type == PageEventType.ALLOCATE) {
                        kept.add(new long[] {page, generation});
                        if (kept.size() > 1024) {
                            kept.clear();
                        }
                    }
                }
            });
            long bytes = warmQuietRoundBytes(s);
            assertTrue(bytes >= 16L * STEPS_PER_ROUND, "a listener keeping an array per hand-out was measured at " + bytes
                    + " bytes in " + STEPS_PER_ROUND + " steps");
        }
    }
}
