package dev.kvshield.memory;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.external.ExternalPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import static org.junit.jupiter.api.Assertions.assertEquals;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;

/**
 * The external backend over engine-owned memory given by raw address and length: the conformance suite, and buffers
 * whose address ranges overlap refused (adjacent ones accepted), so one tenant's page can never alias another's.
 */
class ExternalConformanceTest extends PageMemoryConformanceTest {
    private final List<Arena> engineArenas = new ArrayList<>();

    @Override
    protected PageMemory create(PoolGeometry g) {
        Arena engine = Arena.ofShared();
        engineArenas.add(engine);
        long[] addresses = new long[g.bufferCount()];
        long[] sizes = new long[g.bufferCount()];
        for (int b = 0; b < g.bufferCount(); b++) {
            MemorySegment s = engine.allocate(g.bufferBytes(b), 16);
            addresses[b] = s.address();
            sizes[b] = s.byteSize();
        }
        return ExternalPageMemory.wrap(g, addresses, sizes);
    }

    @AfterEach
    void freeEngineMemory() {
        engineArenas.forEach(Arena::close);
        engineArenas.clear();
    }

    @Test
    void regionsThatDoNotFitTheGeometryAreRefusedNamingBothSizes() {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(4).pageCount(4).build();
        try (Arena engine = Arena.ofConfined()) {
            MemorySegment small = engine.allocate(g.bufferBytes(0) - 1);
            MemorySegment ok = engine.allocate(g.bufferBytes(1));
            InvalidGeometryException e = assertThrows(InvalidGeometryException.class, () -> ExternalPageMemory.wrap(g,
                    new long[] {small.address(), ok.address()}, new long[] {small.byteSize(), ok.byteSize()}));
            assertTrue(e.getMessage().contains(Long.toString(g.bufferBytes(0) - 1)) && e.getMessage().contains(Long.toString(g.bufferBytes(0))),
                    e.getMessage());
            assertThrows(InvalidGeometryException.class,
                    () -> ExternalPageMemory.wrap(g, new long[] {ok.address()}, new long[] {ok.byteSize()}));
            assertThrows(InvalidGeometryException.class,
                    () -> ExternalPageMemory.wrap(g, new long[] {0, ok.address()}, new long[] {64, ok.byteSize()}));
        }
    }

    @Test
    void closingDoesNotFreeEngineMemory() {
        PoolGeometry g = PoolGeometry.builder().mla(1, 8, 1).pageSizeTokens(2).pageCount(3).build();
        try (Arena engine = Arena.ofConfined()) {
            MemorySegment buf = engine.allocate(g.bufferBytes(0));
            buf.fill((byte) 3);
            ExternalPageMemory.wrap(g, new long[] {buf.address()}, new long[] {buf.byteSize()}).close();
            assertTrue(buf.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 5) == 3, "engine memory still readable after close");
        }
    }

    /**
     * Promise (brief/README): bad input, "geometry that does not fit", fails closed with a specific
     * exception; PageMemory: "one region per buffer", page p of buffer b at p * pageBytes(b); the
     * pool's core promise: one request's KV never reaches another tenant. The bridge refuses aliased
     * KV buffers in Python ("each byte of KV must belong to one buffer", buffers.py), but the Java
     * entry point every engine adapter uses does not.
     *
     * <p>Was (isolation): ExternalPageMemory.wrap accepts buffer regions that overlap (here buffer
     * V starts one page into buffer K), so page 1's V bytes ARE page 2's K bytes. A pool over it hands
     * page 1 to tenant "mallory" and page 2 to tenant "victim", and mallory reads the victim's K
     * through its own lease, every guard passing (its slot was written in its generation).
     */
    @Test
    void overlappingExternalBuffersLetOneTenantReadAnothersPage() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(4);
        // tinyGeometry: 2 layers of K and V; alias buffer 1 (layer 0 V) one page into buffer 0 (layer 0 K).
        long pageBytes = g.pageBytes(0);
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            java.lang.foreign.MemorySegment[] regions = new java.lang.foreign.MemorySegment[g.bufferCount()];
            java.lang.foreign.MemorySegment shared = arena.allocate(g.bufferBytes(0) + pageBytes, 64);
            regions[0] = shared.asSlice(0, g.bufferBytes(0));
            regions[1] = shared.asSlice(pageBytes, g.bufferBytes(1));
            for (int b = 2; b < regions.length; b++) {
                regions[b] = arena.allocate(g.bufferBytes(b), 64);
            }
            dev.kvshield.memory.PageMemory memory;
            try {
                memory = dev.kvshield.memory.external.ExternalPageMemory.wrap(g, regions);
            } catch (dev.kvshield.geometry.InvalidGeometryException refused) {
                return; // the promised behaviour: aliased buffers refused before any page exists
            }
            KvPagePool pool = KvPagePool.create(dev.kvshield.pool.PoolConfig.builder(g).level(ProtectionLevel.ZERO).build(), memory);
            int mallory = pool.tenants().register("mallory");
            int victim = pool.tenants().register("victim");
            long m = Owners.request(1);
            long v = Owners.request(2);
            long[] ml = new long[1];
            long[] vl = new long[1];
            assertTrue(pool.allocate(mallory, m, LeaseKind.OWNER, 1, ml, 0));
            assertTrue(pool.allocate(victim, v, LeaseKind.OWNER, 1, vl, 0));
            int mPage = pool.view().pageOf(ml[0]);
            int vPage = pool.view().pageOf(vl[0]);
            assertEquals(mPage + 1, vPage, "precondition: the victim's page follows mallory's");
            int tokenBytes = g.bytesPerToken(0);
            java.lang.foreign.MemorySegment token = arena.allocate(tokenBytes);
            pool.write(mallory, m, ml[0], 1, 0, token); // mallory writes (zeros) into its own V, slot 0
            java.lang.foreign.MemorySegment secret = arena.allocate(tokenBytes).fill((byte) 0x5A);
            pool.write(victim, v, vl[0], 0, 0, secret); // the victim writes its K, slot 0
            java.lang.foreign.MemorySegment got = arena.allocate(tokenBytes);
            pool.read(mallory, m, ml[0], 1, 0, got); // mallory reads its own V, slot 0
            byte[] seen = got.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
            pool.close();
            assertTrue(!java.util.Arrays.equals(seen, secret.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)),
                    "tenant mallory read tenant victim's KV bytes through its own lease: ExternalPageMemory.wrap accepted"
                            + " overlapping buffer regions");
        }
    }

    /** Regions that touch but do not overlap are accepted, through both of the external backend's entry points. */
    @Test
    void adjacentExternalBuffersAreAcceptedAndOverlappingAddressesRefused() {
        dev.kvshield.geometry.PoolGeometry g = TestPools.tinyGeometry(4);
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            long total = 0;
            for (int b = 0; b < g.bufferCount(); b++) {
                total += g.bufferBytes(b);
            }
            java.lang.foreign.MemorySegment all = arena.allocate(total, 64);
            long[] addresses = new long[g.bufferCount()];
            long[] sizes = new long[g.bufferCount()];
            long at = 0;
            for (int b = 0; b < addresses.length; b++) {
                addresses[b] = all.address() + at;
                sizes[b] = g.bufferBytes(b);
                at += sizes[b];
            }
            dev.kvshield.memory.external.ExternalPageMemory.wrap(g, addresses, sizes).close();
            addresses[2] = addresses[1] + sizes[1] - 1; // one byte into buffer 1
            dev.kvshield.geometry.InvalidGeometryException e = assertThrows(dev.kvshield.geometry.InvalidGeometryException.class,
                    () -> dev.kvshield.memory.external.ExternalPageMemory.wrap(g, addresses, sizes));
            assertTrue(e.getMessage().contains("overlaps"), e.getMessage());
        }
    }
}
