package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The allocator's own life under bad calls: a step boundary belongs to the step even when the call that carried it is
 * refused, a constructor that fails closes what it started (the metrics port), and a closed allocator hands out
 * nothing.
 */
class AllocatorLifecycleChecksTest extends SmallPoolFixture {
    /**
     * Rule (lead's decision): the step boundary rides on the step's first crossing (the caller has
     * consumed its flag), so it belongs to the step, not to the call: it runs exactly once even when the call's own
     * arguments are then refused, and the refused operation changes nothing else. The pool after the refused free equals
     * the pool of a twin allocator that ran the same calls and one explicit endStep.
     */
    @Test
    void aRejectedCallHasAlreadyRunItsStepBoundary() {
        int quarantinedMask = 1 << dev.kvshield.lifecycle.PageState.QUARANTINED.ordinal();
        int[] out = new int[PAGES];
        long expected;
        try (OffHeapPageMemory twinMemory = OffHeapPageMemory.allocate(
                PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(1).pageCount(PAGES).build())) {
            SlotAllocator twin = SlotAllocator.create(new HashMap<>(Map.of("advertisedContextTokens", "16")),
                    twinMemory.geometry(), twinMemory);
            twin.bind(ByteBuffer.allocateDirect(PAGES * 8).order(ByteOrder.nativeOrder()),
                    ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder()));
            assertEquals(4, twin.alloc(4, 0, 0));
            assertEquals(0, twin.free(4, twin.defaultTenant(), -1, 0));
            twin.endStep();
            expected = twin.pool().stateDigest();
            twin.close();
        }
        SlotAllocator a = allocator(1);
        assertEquals(4, a.alloc(4, 0, 0));
        assertEquals(0, a.free(4, a.defaultTenant(), -1, 0));
        assertEquals(4, a.pagesIn(quarantinedMask, out));
        io.put(0, 99_999);
        assertThrows(IllegalArgumentException.class, () -> a.free(1, a.defaultTenant(), -1, SlotAllocator.STEP_BOUNDARY));
        assertEquals(0, a.pagesIn(quarantinedMask, out), "the step's boundary did not run");
        assertEquals(expected, a.pool().stateDigest(), "the refused free changed more than its step's boundary");
    }

    /**
     * Promise (brief: bad input fails closed and leaves nothing behind; SlotAllocator constructor: a metrics endpoint it
     * cannot start closes the pool before throwing): the default tenant is registered last, after the pool was created
     * and the loopback metrics endpoint started, with nothing to undo them when the name is refused. A server whose
     * {@code defaultTenant} setting is ill-formed (here blank) gets the IllegalArgumentException, but the metrics port
     * stays bound (and the pool's protection worker stays up), so the corrected retry on the same port fails.
     */
    @Test
    void aRefusedDefaultTenantNameLeavesTheMetricsPortBound() throws java.io.IOException {
        memory = OffHeapPageMemory.allocate(PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(1).pageCount(PAGES).build());
        int port;
        try (java.net.ServerSocket probe = new java.net.ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            port = probe.getLocalPort(); // a port free now
        }
        assertThrows(IllegalArgumentException.class, () -> SlotAllocator.create(
                Map.of("advertisedContextTokens", "16", "metricsBasePort", Integer.toString(port), "defaultTenant", " "),
                memory.geometry(), memory));
        try (SlotAllocator retry = SlotAllocator.create(Map.of("advertisedContextTokens", "16", "metricsBasePort",
                Integer.toString(port)), memory.geometry(), memory)) {
            assertEquals(port, retry.metricsPort());
        }
    }

    /**
     * Promise (brief: fail closed, loudly; SlotAllocator.close: "Stops ... the pool's protection worker; closes the memory
     * if open built it"): nothing checks that the allocator is still open. After close() (memory closed by open()), alloc
     * still hands out four slots over the closed memory, and the free of them "succeeds" (the pool's protection then fails
     * in the background and retires the pages, logged only), instead of an IllegalStateException.
     */
    @Test
    void aClosedAllocatorStillAllocates() {
        SlotAllocator a = SlotAllocator.open(Map.of("backend", "cpu-offheap", "advertisedContextTokens", "16"), 1, PAGES,
                new String[] {"K", "V"}, new String[] {"k", "v"}, new int[] {64, 64}, new long[] {0, 0}, new long[] {0, 0}, -1, 0,
                new long[0]);
        a.bind(ByteBuffer.allocateDirect(PAGES * 8).order(ByteOrder.nativeOrder()),
                ByteBuffer.allocateDirect(8 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder()));
        a.close();
        assertThrows(IllegalStateException.class, () -> a.alloc(4, 0, 0));
    }
}
