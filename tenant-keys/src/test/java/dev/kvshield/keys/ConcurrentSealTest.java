package dev.kvshield.keys;

import static dev.kvshield.keys.EncryptFixture.SMALL;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Two threads seal and unseal disjoint pages through one sealer at the same time (a protection
 * worker sealing while the scheduler reclaims); every page ends with exactly the bytes the
 * reference keystream gives.
 */
class ConcurrentSealTest {
    private static final int ROUNDS = 200;

    @Test
    void concurrentSealsAndUnsealsOnDisjointPagesStayExact() throws Exception {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int alice = tenants.register("alice");
        int bob = tenants.register("bob");
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(SMALL);
                TenantKeyring keyring = TenantKeyring.open(RootKeySource.ephemeral(), "pool-c", 0, tenants);
                ExecutorService threads = Executors.newFixedThreadPool(2)) {
            HostPageSealer sealer = new HostPageSealer(new SealLedger(keyring, SMALL.pageCount()), memory);
            for (int p = 0; p < SMALL.pageCount(); p++) {
                for (int b = 0; b < SMALL.bufferCount(); b++) {
                    byte[] plain = EncryptFixture.plaintext(p, b, 0, (int) SMALL.pageBytes(b));
                    MemorySegment.copy(plain, 0, memory.hostRegion(p, b), ValueLayout.JAVA_BYTE, 0, plain.length);
                }
            }
            CountDownLatch start = new CountDownLatch(1);
            int[][] pagesOf = {{1, 2, 3, 4}, {5, 6, 7, 8}};
            int[] tenantOf = {alice, bob};
            Future<?>[] done = new Future<?>[2];
            for (int t = 0; t < 2; t++) {
                int[] pages = pagesOf[t];
                int tenant = tenantOf[t];
                done[t] = threads.submit(() -> {
                    start.await();
                    int[] generations = new int[pages.length];
                    for (int round = 1; round <= ROUNDS; round++) {
                        java.util.Arrays.fill(generations, round);
                        int epoch = sealer.seal(tenant, pages, generations, 0, pages.length);
                        if (round < ROUNDS) {
                            sealer.unseal(tenant, epoch, pages, generations, 0, pages.length);
                        }
                    }
                    return null;
                });
            }
            start.countDown();
            for (Future<?> f : done) {
                f.get(60, TimeUnit.SECONDS);
            }
            for (int t = 0; t < 2; t++) {
                byte[] key = TestKeys.keyBytes(keyring, tenantOf[t], 0);
                for (int page : pagesOf[t]) {
                    assertEquals(ROUNDS, sealer.ledger().highestSealedGeneration(page));
                    for (int b = 0; b < SMALL.bufferCount(); b++) {
                        EncryptFixture.assertSealedWithReferenceKeystream(EncryptFixture.plaintext(page, b, 0, (int) SMALL.pageBytes(b)),
                                EncryptFixture.raw(memory, page, b), key, page, ROUNDS, b);
                    }
                }
            }
            assertArrayEquals(EncryptFixture.plaintext(0, 0, 0, (int) SMALL.pageBytes(0)), EncryptFixture.raw(memory, 0, 0),
                    "an unlisted page is untouched");
        }
    }
}
