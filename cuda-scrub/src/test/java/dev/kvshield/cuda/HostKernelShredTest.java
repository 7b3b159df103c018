package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.cuda.seal.CudaPageSealer;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.TenantKeyring;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.TenantRegistry;
import dev.kvshield.memory.ForwardingPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.opentest4j.AssertionFailedError;

/**
 * A tenant shredded after the ledger accepted a seal but before the launch: the GPU sealer never
 * launches with the key and leaves the pages zeroed, never plaintext. The planted twin (a scrub
 * that skips a buffer) must fail the oracle.
 */
class HostKernelShredTest {
    private static final PoolGeometry G = PoolGeometry.builder().mha(2, 2, 8, 2).pageSizeTokens(4).pageCount(6).build();

    /** Forwards to the host-build memory, shredding the tenant just before the chacha20-xor launch. */
    private static final class ShredBeforeLaunch extends ForwardingPageMemory implements PageKeystreamXor {
        private final TenantKeyring keyring;
        private final int tenant;

        ShredBeforeLaunch(HostKernelPageMemory memory, TenantKeyring keyring, int tenant) {
            super(memory);
            this.keyring = keyring;
            this.tenant = tenant;
        }

        @Override
        public void chacha20Xor(int[] pages, int[] generations, byte[] keySlots, int offset, int count, int keyCount,
                KeyLoader keys) {
            keyring.shred(tenant);
            ((HostKernelPageMemory) delegate).chacha20Xor(pages, generations, keySlots, offset, count, keyCount, keys);
        }
    }

    private static void shredMidSealLeavesZeros(KernelLauncher launcher) {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int tenant = tenants.register("tenant-a");
        try (TenantKeyring keyring = TenantKeyring.open(RootKeySource.ephemeral(), "pool-s", 0, tenants);
                PageMemory memory = new ShredBeforeLaunch(HostKernelPageMemory.allocate(G, launcher, 3, 32), keyring, tenant);
                Arena arena = Arena.ofConfined()) {
            KernelDifferential.fillRandom(new SplittableRandom(77), G, arena, memory);
            CudaPageSealer sealer = new CudaPageSealer(new SealLedger(keyring, G.pageCount()), (PageKeystreamXor) memory);
            int[] pages = {2, 5};
            assertThrows(ProtectionException.class, () -> sealer.seal(tenant, pages, new int[] {1, 1}, 0, 2));
            for (int page : pages) {
                for (int b = 0; b < G.bufferCount(); b++) {
                    MemorySegment dst = arena.allocate(G.pageBytes(b));
                    memory.read(page, b, 0, dst);
                    assertArrayEquals(new byte[(int) dst.byteSize()], dst.toArray(ValueLayout.JAVA_BYTE),
                            "page " + page + " buffer " + b + " after a seal whose key vanished");
                }
            }
        }
    }

    @Test
    void aKeyShreddedBetweenLedgerAndLaunchLeavesZeroedPages() {
        shredMidSealLeavesZeros(HostKernels.require());
    }

    @Test
    void plantedSkippedBufferLeavesPlaintextAndFailsTheOracle() {
        assertThrows(AssertionFailedError.class, () -> shredMidSealLeavesZeros(PlantedBugs.skippedBuffer(HostKernels.require())));
    }
}
