package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.cuda.seal.CudaPageSealerFactory;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Leases;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import org.junit.jupiter.api.Test;
import org.opentest4j.AssertionFailedError;

/**
 * The pool end to end over the kernels' host build: under ZERO a released page reads back zero in
 * every buffer; under ENCRYPT (GPU sealer) it holds no plaintext word, its owner reclaims the
 * plaintext, and another tenant gets zeros. Each oracle reads raw page bytes and has a planted
 * skipped-buffer twin that must make it fail.
 */
class HostKernelPoolTest {
    private static final PoolGeometry G = PoolGeometry.builder().mha(2, 2, 8, 2).pageSizeTokens(16).pageCount(9).build();
    private static final long REQ1 = Owners.request(1);
    private static final long REQ2 = Owners.request(2);

    private static KvPagePool pool(PageMemory memory, ProtectionLevel level) {
        PoolConfig.Builder config = PoolConfig.builder(G).level(level).poolId("pool-gpu").rank(0);
        if (level.needsKeySource()) {
            config.sealer(new CudaPageSealerFactory(RootKeySource.ephemeral()));
        }
        return KvPagePool.create(config.build(), memory);
    }

    private static byte plain(int page, int buffer, int i) {
        return (byte) (0x41 + (page * 7 + buffer * 3 + i) % 26);
    }

    /**
     * Allocates {@code n} pages for (tenant, REQ1), writes the plaintext pattern into every buffer
     * and releases them; returns the handles (page and generation) the leases had before the release.
     */
    private static long[] writeAndRelease(KvPagePool pool, int tenant, int n) {
        long[] leases = new long[n];
        assertTrue(pool.allocate(tenant, REQ1, LeaseKind.OWNER, n, leases, 0));
        try (Arena arena = Arena.ofConfined()) {
            for (long l : leases) {
                for (int b = 0; b < G.bufferCount(); b++) {
                    MemorySegment src = arena.allocate(G.pageBytes(b));
                    for (int i = 0; i < src.byteSize(); i++) {
                        src.set(ValueLayout.JAVA_BYTE, i, plain(pool.view().pageOf(l), b, i));
                    }
                    pool.write(tenant, REQ1, l, b, 0, src);
                }
            }
        }
        long[] handles = Leases.handles(pool, leases);
        pool.release(tenant, REQ1, leases, 0, n, ReleaseReason.FINISHED);
        pool.endStep();
        return handles;
    }

    private static void assertZero(PageMemory memory, int page) {
        for (int b = 0; b < G.bufferCount(); b++) {
            byte[] raw = memory.hostRegion(page, b).toArray(ValueLayout.JAVA_BYTE);
            assertArrayEquals(new byte[raw.length], raw, "page " + page + " buffer " + b + " not zero");
        }
    }

    private static void assertNoPlaintextWord(PageMemory memory, int page) {
        for (int b = 0; b < G.bufferCount(); b++) {
            byte[] raw = memory.hostRegion(page, b).toArray(ValueLayout.JAVA_BYTE);
            for (int i = 0; i + 8 <= raw.length; i += 8) {
                boolean same = true;
                for (int j = i; j < i + 8 && same; j++) {
                    same = raw[j] == plain(page, b, j);
                }
                assertTrue(!same, "page " + page + " buffer " + b + ": plaintext word at offset " + i + " survived sealing");
            }
        }
    }

    private static void zeroLevelScrubsEveryBuffer(KernelLauncher launcher) {
        try (PageMemory memory = HostKernelPageMemory.allocate(G, launcher, 3, 64);
                KvPagePool pool = pool(memory, ProtectionLevel.ZERO)) {
            int alice = pool.tenants().register("alice");
            for (long h : writeAndRelease(pool, alice, 3)) {
                assertEquals(PageState.FREE, pool.view().stateOf(PageHandles.page(h)));
                assertZero(memory, PageHandles.page(h));
            }
        }
    }

    private static void encryptLevelSealsReclaimsAndZeroesForOthers(KernelLauncher launcher) {
        try (PageMemory memory = HostKernelPageMemory.allocate(G, launcher, 3, 64);
                KvPagePool pool = pool(memory, ProtectionLevel.ENCRYPT)) {
            int alice = pool.tenants().register("alice");
            int bob = pool.tenants().register("bob");
            long[] released = writeAndRelease(pool, alice, 2);
            for (long h : released) {
                assertEquals(PageState.SEALED, pool.view().stateOf(PageHandles.page(h)));
                assertNoPlaintextWord(memory, PageHandles.page(h));
            }
            long[] refs = {PageHandles.sealedReference(released[0])};
            long[] reclaimed = new long[1];
            assertEquals(1, pool.reclaim(alice, REQ2, LeaseKind.OWNER, refs, 0, 1, reclaimed, 0));
            int page = pool.view().pageOf(reclaimed[0]);
            assertEquals(PageHandles.page(released[0]), page);
            for (int b = 0; b < G.bufferCount(); b++) {
                byte[] raw = memory.hostRegion(page, b).toArray(ValueLayout.JAVA_BYTE);
                for (int i = 0; i < raw.length; i++) {
                    assertEquals(plain(page, b, i), raw[i], "reclaimed page " + page + " buffer " + b + " byte " + i);
                }
            }
            int free = pool.snapshot().free();
            long[] bobs = new long[free + 1];
            assertTrue(pool.allocate(bob, REQ1, LeaseKind.OWNER, bobs.length, bobs, 0));
            assertEquals(PageHandles.page(released[1]), pool.view().pageOf(bobs[free]), "alice's sealed page goes to bob last");
            assertZero(memory, pool.view().pageOf(bobs[free]));
        }
    }

    @Test
    void zeroLevelReleaseLeavesEveryBufferZero() {
        zeroLevelScrubsEveryBuffer(HostKernels.require());
    }

    @Test
    void plantedSkippedBufferFailsTheZeroOracle() {
        assertThrows(AssertionFailedError.class, () -> zeroLevelScrubsEveryBuffer(PlantedBugs.skippedBuffer(HostKernels.require())));
    }

    @Test
    void encryptLevelWithTheGpuSealerSealsReclaimsAndHandsOthersZeros() {
        encryptLevelSealsReclaimsAndZeroesForOthers(HostKernels.require());
    }

    @Test
    void plantedSkippedBufferFailsTheSealOracle() {
        assertThrows(AssertionFailedError.class,
                () -> encryptLevelSealsReclaimsAndZeroesForOthers(PlantedBugs.skippedBuffer(HostKernels.require())));
    }
}
