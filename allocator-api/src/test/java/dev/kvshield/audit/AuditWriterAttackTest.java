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
import java.util.Collections;
import java.util.List;
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

    /** A trail of {@code p}'s pool into rotating files in {@code where}. */
    private static AuditTrail attached(TestPools p, Path where, AuditKeys.SigningKey key) throws IOException {
        return AuditTrail.attach(p.pool, AuditFixtures.config(where, key, 1 << 20).build());
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
        AuditTrail trail = detached(sink, AuditConfig.builder().checkpointEveryRecords(1), names);
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
        AuditTrail trail = AuditTrail.attach(p.pool, AuditConfig.builder().sink(sink).signingKey(AuditKeys.generateInMemory())
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
        AuditTrail trail = detached(sink, AuditConfig.builder(), t -> "tenant" + t);
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
        AuditTrail trail = AuditTrail.detached(AuditConfig.builder().sink(sink).signingKey(key)
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
}
