package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.ForeignAccessException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class SlotAllocatorTest {
    private static final int PAGE = 4;
    private static final int PAGES = 17;

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(2, 1, 4, 4).pageSizeTokens(PAGE).pageCount(PAGES).build();
    }

    private record Rig(SlotAllocator allocator, ByteBuffer io, ByteBuffer plan) {
        long[] slots(int n) {
            long[] out = new long[n];
            io.asLongBuffer().get(0, out);
            return out;
        }

        void put(long... slots) {
            io.asLongBuffer().put(0, slots);
        }

        void row(int r, long request, long tenant, long prefix, long seq, long lastLoc) {
            plan.asLongBuffer().put(r * SlotAllocator.PLAN_ROW, new long[] {request, tenant, prefix, seq, lastLoc});
        }
    }

    private static Rig rig(Map<String, String> settings, PageMemory memory) {
        SlotAllocator a = SlotAllocator.create(settings, geometry(), memory);
        ByteBuffer io = ByteBuffer.allocateDirect(PAGES * PAGE * 8).order(java.nio.ByteOrder.nativeOrder());
        ByteBuffer plan = ByteBuffer.allocateDirect(16 * SlotAllocator.PLAN_ROW * 8).order(java.nio.ByteOrder.nativeOrder());
        a.bind(io, plan);
        return new Rig(a, io, plan);
    }

    /**
     * The headroom setting is read as the decimal written: 90 slots less 0.3 hold exactly 63 tokens
     * (62.99999999999999 in doubles), so a strict pool advertising 63 starts and one advertising 64 does not.
     */
    @Test
    void headroomIsExactAtAnExactFit() {
        PoolGeometry ninetySlots = PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(9).pageCount(11).build();
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(ninetySlots);
                SlotAllocator fits = SlotAllocator.create(Map.of(BridgeSettings.ADVERTISED_CONTEXT_TOKENS, "63",
                        BridgeSettings.HEADROOM_FRACTION, "0.3", BridgeSettings.STRICT_ADMISSION, "true"), ninetySlots, m)) {
            assertEquals(63, fits.admission().effectiveTokens());
        }
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(ninetySlots)) {
            dev.kvshield.admission.PoolTooSmallException over = assertThrows(dev.kvshield.admission.PoolTooSmallException.class,
                    () -> SlotAllocator.create(Map.of(BridgeSettings.ADVERTISED_CONTEXT_TOKENS, "64", BridgeSettings.HEADROOM_FRACTION,
                            "0.3", BridgeSettings.STRICT_ADMISSION, "true"), ninetySlots, m));
            assertTrue(over.getMessage().contains("pool holds 63 tokens (90 token slots with 0.3 kept as headroom)"), over.getMessage());
        }
        IllegalArgumentException nan = assertThrows(IllegalArgumentException.class,
                () -> BridgeSettings.parse(Map.of(BridgeSettings.HEADROOM_FRACTION, "NaN")));
        assertEquals("headroomFraction must be a number in [0, 1): 'NaN'", nan.getMessage());
    }

    @Test
    void allocReturnsWholePagesAndReusesFreedPagesFirst() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry())) {
            Rig r = rig(Map.of("advertisedContextTokens", "64"), m);
            assertEquals(8, r.allocator().alloc(8, 0, 0));
            assertArrayEquals(new long[] {4, 5, 6, 7, 8, 9, 10, 11}, r.slots(8));
            r.put(9, 8);
            assertEquals(0, r.allocator().free(2, -1, -1, 0));
            assertEquals(-1, r.allocator().alloc(16 * PAGE, 0, SlotAllocator.STEP_BOUNDARY));
            assertEquals(4, r.allocator().alloc(4, 0, 0));
            assertArrayEquals(new long[] {8, 9, 10, 11}, r.slots(4));
        }
    }

    @Test
    void extendFillsThePartialPageThenNewPagesAndAttributes() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry())) {
            Rig r = rig(Map.of("advertisedContextTokens", "64"), m);
            int t = r.allocator().tenantId("acme");
            r.row(0, 7, t, 0, 6, -1);
            assertEquals(6, r.allocator().allocExtend(1, 6, 0));
            assertArrayEquals(new long[] {4, 5, 6, 7, 8, 9}, r.slots(6));
            r.row(0, 7, t, 6, 11, 9);
            assertEquals(5, r.allocator().allocExtend(1, 5, 0));
            assertArrayEquals(new long[] {10, 11, 12, 13, 14}, r.slots(5));
            assertEquals(7, r.allocator().requestOf(3));
            assertEquals(t, r.allocator().tenantOf(3));
            int other = r.allocator().tenantId("globex");
            r.row(0, 8, other, 11, 12, 14);
            assertThrows(ForeignAccessException.class, () -> r.allocator().allocExtend(1, 1, 0));
        }
    }

    @Test
    void strictModeThrowsThePoolsExceptionAndReleasesNothing() {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry())) {
            Rig r = rig(Map.of("strict", "true", "advertisedContextTokens", "64"), m);
            r.allocator().alloc(8, 0, 0);
            r.put(4);
            r.allocator().free(1, -1, -1, 0);
            long digest = r.allocator().pool().stateDigest();
            r.put(8, 4);
            ForeignAccessException e = assertThrows(ForeignAccessException.class, () -> r.allocator().free(2, -1, -1, 0));
            assertTrue(e.getMessage().contains("page 1") && e.getMessage().contains("QUARANTINED"), e.getMessage());
            assertEquals(digest, r.allocator().pool().stateDigest());
            assertEquals(dev.kvshield.lifecycle.PageState.OWNED, r.allocator().pool().view().stateOf(2));
            assertEquals(1, r.allocator().rejectedFrees());
        }
    }

    /** A backend whose scrub takes a while: protection finishes long after release on the worker. */
    private static final class SlowMemory implements PageMemory {
        private final OffHeapPageMemory inner = OffHeapPageMemory.allocate(SlotAllocatorTest.geometry());

        @Override public PoolGeometry geometry() { return inner.geometry(); }
        @Override public void scrub(int[] pages, int offset, int count) {
            try {
                Thread.sleep(3);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            inner.scrub(pages, offset, count);
        }
        @Override public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
            return inner.verifyZero(pages, offset, count, dirtyOut);
        }
        @Override public void write(int page, int buffer, int slot, MemorySegment src) { inner.write(page, buffer, slot, src); }
        @Override public void read(int page, int buffer, int slot, MemorySegment dst) { inner.read(page, buffer, slot, dst); }
        @Override public String describe() { return "slow " + inner.describe(); }
        @Override public void close() { inner.close(); }
    }

    @Test
    void ranksFedTheSameCallsDecideTheSameWithDelayedProtection() {
        long seed = 0x5EEDL;
        SplittableRandom rnd = new SplittableRandom(seed);
        try (OffHeapPageMemory fast = OffHeapPageMemory.allocate(geometry()); SlowMemory slow = new SlowMemory()) {
            Rig a = rig(Map.of("advertisedContextTokens", "64"), fast);
            Rig b = rig(Map.of("quarantine", "ASYNCHRONOUS", "advertisedContextTokens", "64"), slow);
            java.util.List<long[]> live = new java.util.ArrayList<>();
            for (int step = 0; step < 80; step++) {
                if (!live.isEmpty() && rnd.nextInt(100) < 45) {
                    long[] victim = live.remove(rnd.nextInt(live.size()));
                    a.put(victim);
                    b.put(victim);
                    a.allocator().free(victim.length, -1, -1, SlotAllocator.STEP_BOUNDARY);
                    b.allocator().free(victim.length, -1, -1, SlotAllocator.STEP_BOUNDARY);
                } else {
                    long n = PAGE * (1 + rnd.nextInt(4));
                    long ra = a.allocator().alloc(n, 0, SlotAllocator.STEP_BOUNDARY);
                    long rb = b.allocator().alloc(n, 0, SlotAllocator.STEP_BOUNDARY);
                    assertEquals(ra, rb, "seed " + seed + " step " + step);
                    if (ra > 0) {
                        assertArrayEquals(a.slots((int) n), b.slots((int) n), "seed " + seed + " step " + step);
                        live.add(a.slots((int) n));
                    }
                }
                assertEquals(a.allocator().availableTokens(), b.allocator().availableTokens(), "seed " + seed + " step " + step);
            }
            a.allocator().close();
            b.allocator().close();
        }
    }

    /** Request A of tenant 1 writes a pattern and frees; request B of tenant 2 reads its new pages' raw bytes. */
    private static byte[] bytesSeenByNextTenant(String level) {
        try (OffHeapPageMemory m = OffHeapPageMemory.allocate(geometry())) {
            Rig r = rig(Map.of("level", level, "sealerFactory", XorTestSealerFactory.class.getName(),
                    "advertisedContextTokens", "64"), m);
            int t1 = r.allocator().tenantId("tenant-1");
            int t2 = r.allocator().tenantId("tenant-2");
            r.row(0, 1, t1, 0, 8, -1);
            r.allocator().alloc(8, 1, 0);
            long[] slotsA = r.slots(8);
            for (long slot : new long[] {slotsA[0], slotsA[4]}) {
                for (int b = 0; b < geometry().bufferCount(); b++) {
                    m.hostRegion((int) (slot / PAGE), b).fill((byte) 0x3C);
                }
            }
            // Sealed pages go to other tenants only once clean ones run out: hold every other page.
            r.row(0, 3, t1, 0, (PAGES - 3) * PAGE, -1);
            r.allocator().alloc((PAGES - 3) * PAGE, 1, 0);
            r.put(slotsA);
            r.allocator().free(8, t1, 1, 0);
            r.row(0, 2, t2, 0, 8, -1);
            r.allocator().alloc(8, 1, SlotAllocator.STEP_BOUNDARY);
            assertArrayEquals(slotsA, r.slots(8), "B must get A's pages for the test to mean anything");
            java.io.ByteArrayOutputStream seen = new java.io.ByteArrayOutputStream();
            for (long slot : new long[] {slotsA[0], slotsA[4]}) {
                for (int b = 0; b < geometry().bufferCount(); b++) {
                    seen.writeBytes(m.hostRegion((int) (slot / PAGE), b).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE));
                }
            }
            r.allocator().close();
            return seen.toByteArray();
        }
    }

    @Test
    void encryptedPagesReachAnotherTenantZeroed() {
        for (byte b : bytesSeenByNextTenant("ENCRYPT")) {
            assertEquals(0, b);
        }
    }

    @Test
    void twinWithoutProtectionShowsThePattern() {
        for (byte b : bytesSeenByNextTenant("NONE")) {
            assertEquals(0x3C, b);
        }
    }

    @Test
    void unknownBackendNamesWhatWasFound() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> dev.kvshield.bridge.memory.PageMemoryProviders.byName("rocm"));
        assertTrue(e.getMessage().contains("no page-memory backend \"rocm\"; found [cpu-external, cpu-offheap, cuda]"),
                e.getMessage());
    }
}
