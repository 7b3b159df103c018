package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.lease.LeaseKind;
import dev.kvshield.metrics.MetricNames;
import dev.kvshield.pool.HandOutsHaltedException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import java.io.IOError;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.IntFunction;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The trail's writer and durability threads attacked from outside: a sync that fails while the
 * writer encodes the next batch, sinks that throw {@link Error}s, an interrupted scheduler thread,
 * calls after close. Each checks what reached the files (parsed records), the counters exactly,
 * and the pool's hand-outs.
 */
class AuditWriterAttackTest {
    private static final long SPIN_LIMIT_NANOS = TimeUnit.SECONDS.toNanos(2);

    @TempDir
    Path dir;

    /** What a hooked sink does instead of (or before) the real file sink's call; null: nothing. */
    interface SinkStep {
        void run() throws IOException;
    }

    /**
     * Rotating files with hooks: {@code beforeAppend} runs before every append (on the thread that
     * appends), {@code beforeSync} before every sync; each append notes whether the trail had
     * already failed when it began.
     */
    private static final class HookedSink implements AuditSink {
        final AuditSink files;
        final List<String> appendsAfterFailure = Collections.synchronizedList(new ArrayList<>());
        final AtomicReference<AuditTrail> trail = new AtomicReference<>();
        volatile SinkStep beforeAppend;
        volatile SinkStep beforeSync;

        HookedSink(Path where) throws IOException {
            files = AuditSink.rotatingFiles(where, "audit", 1 << 20);
        }

        @Override
        public void append(List<String> lines) throws IOException {
            throw new AssertionError("the trail appends bytes");
        }

        @Override
        public void append(byte[] bytes, int offset, int length) throws IOException {
            AuditTrail t = trail.get();
            if (t != null && t.failure() != null) {
                appendsAfterFailure.add(new String(bytes, offset, length, java.nio.charset.StandardCharsets.UTF_8));
            }
            SinkStep hook = beforeAppend;
            if (hook != null) {
                hook.run();
            }
            files.append(bytes, offset, length);
        }

        @Override
        public void sync() throws IOException {
            SinkStep hook = beforeSync;
            if (hook != null) {
                hook.run();
            }
            files.sync();
        }

        @Override
        public String describe() {
            return "hooked(" + files.describe() + ")";
        }

        @Override
        public void close() throws IOException {
            files.close();
        }
    }

    private static AuditTrail.Scope scope(ProtectionLevel level, IntFunction<String> names) {
        return new AuditTrail.Scope("attack", 0, 8, 4, level, names);
    }

    private static AuditTrail detached(HookedSink sink, AuditConfig.Builder config, IntFunction<String> names) {
        AuditTrail trail = AuditTrail.detached(config.sink(sink).signingKey(AuditKeys.generateInMemory()).build(),
                scope(ProtectionLevel.COMPLIANCE, names));
        sink.trail.set(trail);
        return trail;
    }

    private static void spinUntil(java.util.function.BooleanSupplier condition, String what) {
        long deadline = System.nanoTime() + SPIN_LIMIT_NANOS;
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out waiting until " + what);
            }
            Thread.onSpinWait();
        }
    }

    private static void assertVerifies(Path where, AuditKeys.SigningKey key) throws IOException {
        AuditVerifier.Report r = AuditVerifier.verify(List.of(where), key.publicKey());
        assertTrue(r.ok(), () -> r.problems().toString());
    }

    /** A trail of {@code p}'s pool into rotating files in {@code where}, every batch handed to the writer thread. */
    private static AuditTrail attached(TestPools p, Path where, AuditKeys.SigningKey key) throws IOException {
        return AuditTrail.attach(p.pool, AuditFixtures.config(where, key, 1 << 20).handOffMinStepMicros(0).build());
    }

    /**
     * After a step shorter than {@code handOffMinStepMicros} the boundary's own thread writes the
     * batch before it returns; after a longer one the writer thread does, while the caller goes on
     * (the writer's append is held here, and the boundary returns anyway); either way the trail
     * verifies and lists every page.
     */
    @Test
    void batchesOfShortStepsAreWrittenAtTheBoundaryAndOfLongOnesByTheWriterThread() throws Exception {
        HookedSink sink = new HookedSink(dir);
        List<String> appendedBy = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch release = new CountDownLatch(1);
        AtomicBoolean hold = new AtomicBoolean();
        sink.beforeAppend = () -> {
            appendedBy.add(Thread.currentThread().getName());
            if (hold.get()) {
                try {
                    release.await();
                } catch (InterruptedException e) {
                    throw new java.io.InterruptedIOException("test append interrupted");
                }
            }
        };
        AuditKeys.SigningKey key = AuditKeys.generateInMemory();
        AtomicLong clockNanos = new AtomicLong(1_000_000_000L);
        AuditTrail trail = AuditTrail.detached(AuditConfig.builder().handOffMinStepMicros(500).sink(sink).signingKey(key).build(),
                scope(ProtectionLevel.COMPLIANCE, t -> "tenant" + t), clockNanos::get, 1_700_000_000_000L, "0123456789abcdef0123456789abcdef");
        sink.trail.set(trail);
        String me = Thread.currentThread().getName();
        trail.onPageEvent(PageEventType.ALLOCATE, 1, 1, 0, Owners.request(1), 0);
        clockNanos.addAndGet(499_000);
        trail.onStepBoundary(1);
        assertEquals(List.of(me, me), appendedBy, "the opening record and the 499 µs step, both on this thread");
        hold.set(true);
        for (int page = 0; page < 8; page++) {
            trail.onPageEvent(PageEventType.WRITE, page, 1, 0, Owners.request(1), 4);
        }
        clockNanos.addAndGet(10_000_000);
        trail.onStepBoundary(2);
        spinUntil(() -> appendedBy.size() == 3, "the 10 ms step is appended");
        assertTrue(appendedBy.get(2).endsWith("-writer"), "appended by " + appendedBy.get(2));
        release.countDown();
        trail.close();
        assertVerifies(dir, key);
        List<AuditLog.Line> lines = AuditLog.read(List.of(dir));
        assertEquals(List.of("open", "tenant", "allocate", "write", "checkpoint"), types(lines));
        assertEquals(8, lines.get(3).pages().size(), "the write run lists every page");
    }

    private static List<String> types(List<AuditLog.Line> lines) {
        return lines.stream().map(AuditLog.Line::type).toList();
    }

    /**
     * A checkpoint's sync fails on the durability thread while the writer encodes the next batch
     * (the sync is held until the writer reaches the batch's new tenant, and the writer holds on
     * until the failure has landed): that batch must not reach the sink, its records count as
     * dropped, and nothing follows — no record is written after a failure.
     */
    @Test
    void aSyncFailingWhileTheNextBatchIsEncodedKeepsThatBatchOutOfTheSink() throws IOException {
        Path where = dir.resolve("race");
        HookedSink sink = new HookedSink(where);
        CountDownLatch syncMayFail = new CountDownLatch(1);
        sink.beforeSync = () -> {
            try {
                if (!syncMayFail.await(2, TimeUnit.SECONDS)) {
                    throw new AssertionError("the writer never reached the second batch");
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            throw new IOException("Input/output error");
        };
        IntFunction<String> names = t -> {
            if (t == 1) {
                syncMayFail.countDown();
                spinUntil(() -> sink.trail.get().failure() != null, "the failed sync lands");
            }
            return "tenant" + t;
        };
        AuditTrail trail = detached(sink, AuditConfig.builder().handOffMinStepMicros(0).checkpointEveryRecords(1), names);
        trail.onPageEvent(PageEventType.ALLOCATE, 0, 1, 0, Owners.request(1), 0);
        trail.onStepBoundary(1);
        trail.flush();
        trail.onPageEvent(PageEventType.ALLOCATE, 1, 1, 1, Owners.request(2), 0);
        trail.onStepBoundary(2);
        trail.flush();
        trail.close();

        assertTrue(trail.failure().contains("Input/output error"), trail.failure());
        assertEquals(List.of(), sink.appendsAfterFailure, "appended after the trail had failed");
        List<AuditLog.Line> lines = AuditLog.read(List.of(where));
        assertEquals(List.of("open", "tenant", "allocate", "checkpoint"), types(lines));
        assertEquals(4, trail.recordsWritten());
        assertEquals(1, trail.pageEventsWritten());
        assertEquals(3, trail.recordsDropped(), "the second batch: tenant, allocate and its checkpoint");
    }

    /** A trail checkpointing every record into a sink whose syncs throw {@code runtime} or {@code error} (neither: healthy). */
    private AuditTrail checkpointedPool(TestPools p, String name, RuntimeException runtime, Error error, List<String> shipped)
            throws IOException {
        HookedSink sink = new HookedSink(dir.resolve(name));
        AuditTrail trail = AuditTrail.attach(p.pool, AuditConfig.builder().handOffMinStepMicros(0).sink(sink).signingKey(AuditKeys.generateInMemory())
                .checkpointEveryRecords(1).shipper(shipped::add).build());
        sink.beforeSync = () -> {
            if (runtime != null) {
                throw runtime;
            }
            if (error != null) {
                throw error;
            }
        };
        return trail;
    }

    /**
     * A sync that throws an {@link Error} (a file system reporting {@link IOError}) or a
     * {@link RuntimeException} fails the trail as an {@link IOException} does: nothing is shipped,
     * a COMPLIANCE pool stops handing out pages. Twin: a healthy sync ships every checkpoint.
     */
    @Test
    void aSyncThrowingAnErrorOrRuntimeExceptionFailsTheTrailAndHaltsCompliance() throws IOException {
        Object[][] faults = {
            {new IllegalStateException("Input/output error (runtime)"), null},
            {null, new IOError(new IOException("Input/output error (error)"))},
            {null, null},
        };
        for (Object[] f : faults) {
            RuntimeException runtime = (RuntimeException) f[0];
            Error error = (Error) f[1];
            String name = runtime != null ? "runtime" : error != null ? "error" : "healthy";
            try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
                List<String> shipped = Collections.synchronizedList(new ArrayList<>());
                AuditTrail trail = checkpointedPool(p, name, runtime, error, shipped);
                int a = p.pool.tenants().register("alice");
                long[] h = new long[1];
                assertTrue(p.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
                p.pool.endStep();
                trail.close();
                if (runtime == null && error == null) {
                    assertNull(trail.failure(), name);
                    assertEquals(2, shipped.size(), "the step's checkpoint and the final one: " + shipped);
                    assertTrue(p.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, h, 0), name);
                    continue;
                }
                assertNotNull(trail.failure(), name + ": a sync that threw did not fail the trail");
                assertTrue(trail.failure().contains("Input/output error (" + name + ")"), trail.failure());
                assertEquals(List.of(), shipped, name + ": a checkpoint whose records are not durable left the host");
                HandOutsHaltedException e = assertThrows(HandOutsHaltedException.class,
                        () -> p.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, h, 0), name);
                assertTrue(e.getMessage().contains("Input/output error (" + name + ")"), e.getMessage());
            }
        }
    }

    /** The records a trail drops when its second append throws {@code fault}. */
    private long droppedWhenTheSecondAppendThrows(String name, IOException io, Error error) throws IOException {
        HookedSink sink = new HookedSink(dir.resolve(name));
        int[] appends = {0};
        sink.beforeAppend = () -> {
            if (++appends[0] == 2) {
                if (io != null) {
                    throw io;
                }
                throw error;
            }
        };
        AuditTrail trail = detached(sink, AuditConfig.builder().handOffMinStepMicros(0), t -> "tenant" + t);
        trail.onPageEvent(PageEventType.ALLOCATE, 0, 1, 0, Owners.request(1), 0);
        trail.onStepBoundary(1);
        trail.flush();
        assertTrue(trail.failure().contains("No space left on device"), trail.failure());
        trail.close();
        assertEquals(List.of("open"), types(AuditLog.read(List.of(dir.resolve(name)))));
        assertEquals(1, trail.recordsWritten());
        return trail.recordsDropped();
    }

    /**
     * A sink append that throws an {@link Error} loses exactly the records an {@link IOException}
     * loses, and both are counted: the step's tenant and allocate records (two records of one run).
     */
    @Test
    void anAppendThrowingAnErrorCountsEveryRecordItLostAsAnIOExceptionDoes() throws IOException {
        assertEquals(2, droppedWhenTheSecondAppendThrows("io", new IOException("No space left on device"), null));
        assertEquals(2, droppedWhenTheSecondAppendThrows("error", null, new IOError(new IOException("No space left on device"))));
    }

    /**
     * close() on a thread whose interrupt flag is set (an engine cancelling its scheduler) still
     * returns only after the final checkpoint was synced and shipped, and leaves the flag set.
     */
    @Test
    void closeOnAnInterruptedThreadStillWaitsForTheFinalCheckpoint() throws IOException {
        Path where = dir.resolve("interrupted");
        HookedSink sink = new HookedSink(where);
        List<String> log = Collections.synchronizedList(new ArrayList<>());
        sink.beforeSync = () -> {
            try {
                Thread.sleep(30);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            log.add("synced");
        };
        AuditKeys.SigningKey key = AuditKeys.generateInMemory();
        AuditTrail trail = AuditTrail.detached(AuditConfig.builder().handOffMinStepMicros(0).sink(sink).signingKey(key)
                .shipper(line -> log.add("shipped " + (line.contains("\"final\":true") ? "final" : "periodic"))).build(),
                scope(ProtectionLevel.COMPLIANCE, t -> "tenant" + t));
        trail.onPageEvent(PageEventType.ALLOCATE, 0, 1, 0, Owners.request(1), 0);
        trail.onStepBoundary(1);
        boolean stillInterrupted;
        Thread.currentThread().interrupt();
        try {
            trail.close();
        } finally {
            stillInterrupted = Thread.interrupted();
        }
        assertTrue(stillInterrupted, "close() keeps the caller's interrupt");
        assertEquals(List.of("synced", "shipped final"), List.copyOf(log), "close() returned before the final checkpoint left");
        assertNull(trail.failure());
        assertVerifies(where, key);
    }

    /**
     * The scheduler thread's interrupt flag set while it hands off steps (and may write a batch
     * itself because the writer has not started it): the trail's file channel must survive it, the
     * trail stays healthy, and every step's records are in the files.
     */
    @Test
    void anInterruptedSchedulerThreadDoesNotBreakTheTrailsFiles() throws IOException {
        Path where = dir.resolve("files");
        try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            AuditKeys.SigningKey key = AuditKeys.generateInMemory();
            AuditTrail trail = attached(p, where, key);
            int a = p.pool.tenants().register("alice");
            long[] h = new long[1];
            int steps = 40;
            try {
                for (int s = 0; s < steps; s++) {
                    Thread.currentThread().interrupt();
                    assertTrue(p.pool.allocate(a, Owners.request(s), LeaseKind.OWNER, 1, h, 0), "step " + s);
                    p.pool.release(a, Owners.request(s), h, 0, 1, ReleaseReason.FINISHED);
                    p.pool.endStep();
                    trail.flush();
                    assertTrue(Thread.interrupted(), "the trail keeps the scheduler's interrupt");
                }
            } finally {
                Thread.interrupted();
            }
            trail.close();
            assertNull(trail.failure());
            List<AuditLog.Line> lines = AuditLog.read(List.of(where));
            assertEquals(steps, lines.stream().filter(l -> l.type().equals("allocate")).count());
            assertEquals(lines.size(), trail.recordsWritten());
            assertVerifies(where, key);
        }
    }

    /**
     * After close: flush() and the pool's step boundaries do nothing (no exception, no listener
     * failure), later events count as dropped, and the files stay a verified, final trail.
     */
    @Test
    void callsAfterCloseWriteNothingAndThrowNothing() throws IOException {
        Path where = dir.resolve("after-close");
        try (TestPools p = TestPools.create(9, ProtectionLevel.ZERO)) {
            AuditKeys.SigningKey key = AuditKeys.generateInMemory();
            AuditTrail trail = attached(p, where, key);
            int a = p.pool.tenants().register("alice");
            long[] h = new long[2];
            assertTrue(p.pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            p.pool.endStep();
            trail.close();
            List<String> before = AuditLog.read(List.of(where)).stream().map(AuditLog.Line::text).toList();
            long written = trail.recordsWritten();

            assertDoesNotThrow(trail::flush);
            assertTrue(p.pool.allocate(a, Owners.request(2), LeaseKind.OWNER, 1, h, 1));
            p.pool.endStep();
            p.pool.endStep();
            assertDoesNotThrow(trail::flush);
            assertDoesNotThrow(trail::close);

            double listenerFailures = p.pool.config().meterRegistry().find(MetricNames.LISTENER_FAILURES).counters().stream()
                    .mapToDouble(c -> c.count()).sum();
            assertEquals(0.0, listenerFailures, "a closed trail failed the pool's step boundaries");
            assertEquals(before, AuditLog.read(List.of(where)).stream().map(AuditLog.Line::text).toList());
            assertEquals(written, trail.recordsWritten());
            assertEquals(1, trail.recordsDropped(), "the allocate after close");
            assertNull(trail.failure());
            assertVerifies(where, key);
            assertFalse(before.isEmpty());
        }
    }

    /** One page event as delivered, and as a record lists it: type, generation, tenant, request. */
    private record Delivered(int page, String what) {}

    /** Per page, its events in order, expanded from the records ({@code times} repeats). */
    private static Map<Integer, List<String>> eventsByPage(List<AuditLog.Line> lines) {
        Map<Integer, List<String>> byPage = new TreeMap<>();
        for (AuditLog.Line l : lines) {
            for (AuditLog.PageEntry e : l.pages()) {
                for (long i = 0; i < e.times(); i++) {
                    byPage.computeIfAbsent((int) e.page(), k -> new ArrayList<>())
                            .add(l.type() + ":" + e.generation() + ":" + l.number("tenant", -1) + ":" + l.number("req", -1));
                }
            }
        }
        return byPage;
    }

    private static Map<Integer, List<String>> deliveredByPage(List<Delivered> delivered) {
        Map<Integer, List<String>> byPage = new TreeMap<>();
        for (Delivered d : delivered) {
            byPage.computeIfAbsent(d.page(), k -> new ArrayList<>()).add(d.what());
        }
        return byPage;
    }

    /**
     * Feeds {@code steps} seeded steps of 25 page events (and a request summary every third step) to
     * a detached trail of 8 pages on this thread; notes in {@code readsByRequest} the [page, gen] each
     * request read, in first-read order; returns what was delivered.
     */
    private static List<Delivered> feed(AuditTrail trail, long seed, int steps, Map<Long, List<List<Long>>> readsByRequest) {
        Random rnd = new Random(seed);
        PageEventType[] types = {PageEventType.ALLOCATE, PageEventType.WRITE, PageEventType.READ, PageEventType.READ,
            PageEventType.RELEASE, PageEventType.FREE};
        int[] generation = new int[8];
        java.util.Arrays.fill(generation, 1);
        List<Delivered> delivered = new ArrayList<>();
        for (int step = 0; step < steps; step++) {
            long request = 1 + step / 3;
            int tenant = (int) (request % 2);
            for (int k = 0; k < 25; k++) {
                int page = rnd.nextInt(8);
                PageEventType type = types[rnd.nextInt(types.length)];
                if (type == PageEventType.FREE) {
                    generation[page]++;
                }
                trail.onPageEvent(type, page, generation[page], tenant, Owners.request(request), type == PageEventType.RELEASE ? 0 : 4);
                delivered.add(new Delivered(page, type.name().toLowerCase(java.util.Locale.ROOT) + ":" + generation[page] + ":" + tenant + ":"
                        + request));
                if (type == PageEventType.READ) {
                    List<Long> pg = List.of((long) page, (long) generation[page]);
                    List<List<Long>> read = readsByRequest.computeIfAbsent(request, r -> new ArrayList<>());
                    if (!read.contains(pg)) {
                        read.add(pg);
                    }
                }
            }
            if (step % 3 == 2) {
                trail.requestFinished(tenant, request, RequestOutcome.COMPLETED);
            }
            trail.onStepBoundary(step + 1);
        }
        return delivered;
    }

    /** What the records say differs from what was delivered (per page, in order), or nothing. */
    private static List<String> mismatches(List<AuditLog.Line> lines, List<Delivered> delivered) {
        Map<Integer, List<String>> written = eventsByPage(lines);
        Map<Integer, List<String>> sent = deliveredByPage(delivered);
        List<String> out = new ArrayList<>();
        for (int page : sent.keySet()) {
            if (!sent.get(page).equals(written.get(page))) {
                out.add("page " + page + ": delivered " + sent.get(page) + ", written " + written.get(page));
            }
        }
        return out;
    }

    /**
     * Two trails at once, each fed many steps by its own scheduler thread through a sink that lags
     * (a millisecond per append) with a 16-run buffer that fills mid-step, while a third thread
     * flushes both: every page event is in the records, in its page's order, with exact counts;
     * seq and times never go back; each request's summary lists exactly the pages it read; both
     * trails verify. Twin: the same oracle flags a trail with one record removed.
     */
    @Test
    void laggingWritersWithMidStepHandOffsAndConcurrentFlushesLoseAndReorderNothing() throws Exception {
        int steps = 30;
        AuditKeys.SigningKey key = AuditKeys.generateInMemory();
        AuditTrail[] trails = new AuditTrail[2];
        Path[] where = new Path[2];
        for (int i = 0; i < 2; i++) {
            where[i] = dir.resolve("parallel-" + i);
            HookedSink sink = new HookedSink(where[i]);
            sink.beforeAppend = () -> {
                try {
                    Thread.sleep(1);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            };
            AtomicLong nanos = new AtomicLong(1_000_000_000L);
            trails[i] = AuditTrail.detached(AuditConfig.builder().handOffMinStepMicros(0).sink(sink).signingKey(key).bufferRecords(16).checkpointEveryRecords(20)
                    .build(), new AuditTrail.Scope("pool" + i, i, 8, 4, ProtectionLevel.COMPLIANCE, t -> "tenant" + t),
                    () -> nanos.addAndGet(1_000), 1_700_000_000_000L, "0000000000000000000000000000000" + i);
        }
        AtomicBoolean feeding = new AtomicBoolean(true);
        Thread flusher = new Thread(() -> {
            while (feeding.get()) {
                trails[0].flush();
                trails[1].flush();
                try {
                    Thread.sleep(1);
                } catch (InterruptedException e) {
                    return;
                }
            }
        });
        flusher.start();
        List<CompletableFuture<List<Delivered>>> fed = new ArrayList<>();
        List<Map<Long, List<List<Long>>>> reads = List.of(new HashMap<>(), new HashMap<>());
        for (int i = 0; i < 2; i++) {
            int n = i;
            fed.add(CompletableFuture.supplyAsync(() -> feed(trails[n], 17 + n, steps, reads.get(n))));
        }
        List<List<Delivered>> delivered = List.of(fed.get(0).get(10, TimeUnit.SECONDS), fed.get(1).get(10, TimeUnit.SECONDS));
        feeding.set(false);
        flusher.join(10_000);
        for (int i = 0; i < 2; i++) {
            trails[i].close();
            List<AuditLog.Line> lines = AuditLog.read(List.of(where[i]));
            assertEquals(List.of(), mismatches(lines, delivered.get(i)), "trail " + i);
            assertEquals(delivered.get(i).size(), trails[i].pageEventsWritten());
            assertEquals(lines.size(), trails[i].recordsWritten());
            assertEquals(0, trails[i].recordsDropped());
            for (int k = 1; k < lines.size(); k++) {
                assertEquals(k, lines.get(k).number("seq", -1));
                assertTrue(lines.get(k).number("mono", -1) >= lines.get(k - 1).number("mono", -1), "times go back at seq " + k);
            }
            assertEquals(Boolean.TRUE, lines.getLast().fields().get("final"));
            for (AuditLog.Line summary : lines.stream().filter(l -> l.type().equals("summary")).toList()) {
                long request = summary.number("req", -1);
                assertEquals(reads.get(i).getOrDefault(request, List.of()), summary.fields().get("pagesRead"), "request " + request);
            }
            assertEquals(steps / 3, lines.stream().filter(l -> l.type().equals("summary")).count());
            assertVerifies(where[i], key);
            // Twin: the oracle sees a record gone.
            List<AuditLog.Line> cut = new ArrayList<>(lines);
            cut.remove(lines.stream().filter(l -> l.type().equals("read")).findFirst().orElseThrow());
            assertFalse(mismatches(cut, delivered.get(i)).isEmpty(), "the oracle misses a removed read record");
        }
    }
}
