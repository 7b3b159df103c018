package dev.kvshield.pool;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

/** Asynchronous protection: a page is handed out only after its scrub is confirmed, never when merely queued. */
class AsyncHandOutOrderingTest {
    @Test
    void allocationUnderPressureWaitsForTheScrubAndGetsZeros() throws Exception {
        CountDownLatch scrubStarted = new CountDownLatch(1);
        CountDownLatch mayFinish = new CountDownLatch(1);
        AtomicBoolean scrubDone = new AtomicBoolean();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(2), ProtectionLevel.ZERO,
                c -> c.quarantineMode(QuarantineMode.ASYNCHRONOUS), m -> gated(m, scrubStarted, mayFinish, scrubDone));
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            int b = pool.tenants().register("b");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.write(a, Owners.request(1), h[0], 0, 0, Patterns.fill(arena, pool.geometry().pageBytes(0), a, 1, 1, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            assertTrue(scrubStarted.await(5, TimeUnit.SECONDS));
            Thread releaser = Thread.ofPlatform().start(() -> {
                try {
                    Thread.sleep(100);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                mayFinish.countDown();
            });
            long[] hb = new long[1];
            assertTrue(pool.allocate(b, Owners.request(2), LeaseKind.OWNER, 1, hb, 0));
            assertTrue(scrubDone.get(), "handed out before its scrub finished");
            assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(hb[0]))));
            releaser.join();
        }
    }

    @Test
    void aBoundaryThatCannotConfirmProtectionFailsLoudlyAndKeepsThePageQuarantined() throws Exception {
        CountDownLatch scrubStarted = new CountDownLatch(1);
        CountDownLatch mayFinish = new CountDownLatch(1);
        AtomicBoolean scrubDone = new AtomicBoolean();
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(3), ProtectionLevel.ZERO,
                c -> c.quarantineMode(QuarantineMode.ASYNCHRONOUS).protectionTimeout(Duration.ofMillis(50)),
                m -> gated(m, scrubStarted, mayFinish, scrubDone))) {
            KvPagePool pool = t.pool;
            int a = pool.tenants().register("a");
            long[] h = new long[1];
            assertTrue(pool.allocate(a, Owners.request(1), LeaseKind.OWNER, 1, h, 0));
            pool.release(a, Owners.request(1), h, 0, 1, ReleaseReason.FINISHED);
            ProtectionException e = assertThrows(ProtectionException.class, pool::endStep);
            assertTrue(e.getMessage().contains("not confirmed within 50 ms"), e.getMessage());
            assertEquals(PageState.QUARANTINED, pool.view().stateOf(1));
            mayFinish.countDown();
            while (!scrubDone.get()) {
                Thread.onSpinWait(); // the boundary's 50 ms budget must not race a loaded machine
            }
            pool.endStep();
            assertEquals(PageState.FREE, pool.view().stateOf(1));
        }
    }

    static PageMemory gated(PageMemory m, CountDownLatch started, CountDownLatch mayFinish, AtomicBoolean done) {
        AtomicBoolean startupScrubbed = new AtomicBoolean();
        return new ForwardingPageMemory(m) {
            @Override
            public void scrub(int[] pages, int offset, int count) {
                if (!startupScrubbed.getAndSet(true)) {
                    super.scrub(pages, offset, count);
                    return;
                }
                started.countDown();
                try {
                    mayFinish.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                super.scrub(pages, offset, count);
                done.set(true);
            }
        };
    }
}
