package dev.kvshield.bridge.memory;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.cuda.CudaDevice;
import dev.kvshield.cuda.CudaPageMemory;
import dev.kvshield.cuda.CudaProbe;
import dev.kvshield.cuda.seal.CudaPageSealerFactory;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.testing.Requirements;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Map;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/** The {@code cuda} provider: found by name, checks its hand-over before the GPU, GPU sealer for ENCRYPT. */
class CudaMemoryProviderTest {
    private static final PoolGeometry GEOMETRY = PoolGeometry.builder().mha(2, 1, 4, 4).pageSizeTokens(4).pageCount(9).build();

    private static EngineBuffers device(long[] addresses, long[] events) {
        return new EngineBuffers(addresses, new long[] {1 << 20, 1 << 20, 1 << 20, 1 << 20}, 0, 0, events);
    }

    @Test
    void foundByNameThroughTheServiceLoader() {
        assertInstanceOf(CudaMemoryProvider.class, PageMemoryProviders.byName("cuda"));
    }

    @Test
    void refusesHostBuffersNullAddressesAndUnrecordedEvents() {
        CudaMemoryProvider p = new CudaMemoryProvider();
        IllegalArgumentException host = assertThrows(IllegalArgumentException.class,
                () -> p.open(GEOMETRY, new EngineBuffers(new long[] {64, 128, 192, 256}, new long[] {64, 64, 64, 64}, -1, 0,
                        new long[0])));
        assertTrue(host.getMessage().contains("host buffers (device -1)"), host.getMessage());
        IllegalArgumentException nul = assertThrows(IllegalArgumentException.class,
                () -> p.open(GEOMETRY, device(new long[] {256, 0, 512, 768}, new long[0])));
        assertTrue(nul.getMessage().contains("buffer 1 has a null device address"), nul.getMessage());
        IllegalArgumentException event = assertThrows(IllegalArgumentException.class,
                () -> p.open(GEOMETRY, device(new long[] {256, 512, 768, 1024}, new long[] {0x7f00, 0})));
        assertTrue(event.getMessage().contains("engine event 1 has handle 0"), event.getMessage());
    }

    @Test
    void withoutAGpuOpeningNamesTheProbesReason() {
        CudaProbe.Result probe = CudaProbe.probe();
        Assumptions.assumeFalse(probe.available(), "a GPU is present, so the no-GPU refusal cannot be reached");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new CudaMemoryProvider().open(GEOMETRY, device(new long[] {256, 512, 768, 1024}, new long[0])));
        assertTrue(e.getMessage().contains("no usable GPU (" + probe.reason() + ")"), e.getMessage());
    }

    @Test
    void eachBackendBringsTheSealerForItsMemory() {
        assertInstanceOf(CudaPageSealerFactory.class, new CudaMemoryProvider().sealerFactory(RootKeySource.ephemeral()));
        assertInstanceOf(HostPageSealerFactory.class, new ExternalMemoryProvider().sealerFactory(RootKeySource.ephemeral()));
    }

    /**
     * On a GPU: "engine" buffers (device memory another owner allocated), wrapped by address
     * through SlotAllocator.open; tenant 1's pattern is zero when tenant 2 gets the page (ZERO, and
     * ENCRYPT with the GPU sealer over a root key), and visible under NONE (the twin).
     */
    @Test
    void onAGpuFreedPagesReachTheNextTenantZeroed() {
        CudaProbe.Result probe = CudaProbe.probe();
        Requirements.assumeGpu(probe.available(), probe.reason());
        assertEquals(0, bytesSeenByNextTenant(Map.of("level", "ZERO")));
        assertEquals(0, bytesSeenByNextTenant(Map.of("level", "ENCRYPT", "rootKey", "ephemeral")));
        assertEquals(16 * 4, bytesSeenByNextTenant(Map.of("level", "NONE")));
    }

    /** Non-zero bytes tenant 2 reads in the page tenant 1 wrote and freed. */
    private static int bytesSeenByNextTenant(Map<String, String> level) {
        try (CudaDevice device = CudaDevice.open(0); CudaPageMemory engine = CudaPageMemory.allocate(device, GEOMETRY);
                Arena arena = Arena.ofConfined()) {
            long[] addresses = new long[GEOMETRY.bufferCount()];
            long[] sizes = new long[addresses.length];
            for (int b = 0; b < addresses.length; b++) {
                addresses[b] = engine.bufferAddress(b);
                sizes[b] = GEOMETRY.bufferBytes(b);
            }
            Map<String, String> settings = new java.util.HashMap<>(level);
            settings.put("backend", "cuda");
            settings.put("advertisedContextTokens", "32");
            try (SlotAllocator a = SlotAllocator.open(settings, 4, 9, new String[] {"K", "V", "K", "V"},
                    new String[] {"k0", "v0", "k1", "v1"}, new int[] {16, 16, 16, 16}, addresses, sizes, 0, 0, new long[0])) {
                ByteBuffer io = ByteBuffer.allocateDirect(36 * 8).order(ByteOrder.nativeOrder());
                ByteBuffer plan = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
                a.bind(io, plan);
                int t1 = a.tenantId("t1");
                plan.asLongBuffer().put(0, new long[] {1, t1, 0, 4, -1});
                a.alloc(4, 1, 0);
                int page = (int) (io.asLongBuffer().get(0) / 4);
                MemorySegment pattern = arena.allocate(16 * 4);
                pattern.fill((byte) 0x5A);
                engine.write(page, 0, 0, pattern);
                a.freeSegment(1, 0, 4, t1, 0);
                plan.asLongBuffer().put(0, new long[] {2, a.tenantId("t2"), 0, 32, -1});
                assertEquals(32, a.alloc(32, 1, SlotAllocator.STEP_BOUNDARY)); // every page, the freed one included
                MemorySegment seen = arena.allocate(16 * 4);
                engine.read(page, 0, 0, seen);
                int nonZero = 0;
                for (long i = 0; i < seen.byteSize(); i++) {
                    nonZero += seen.get(ValueLayout.JAVA_BYTE, i) != 0 ? 1 : 0;
                }
                return nonZero;
            }
        }
    }
}
