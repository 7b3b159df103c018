package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.cuda.seal.CudaPageSealer;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealer;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.TenantKeyring;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.Arena;
import java.util.SplittableRandom;
import java.util.function.Function;

/**
 * The GPU sealer ({@link CudaPageSealer}) against tenant-keys' CPU sealer sharing one keyring, on
 * identical memory: the oracle of the host-build and GPU sealer tests.
 */
final class SealerAgreement {
    private SealerAgreement() {}

    /**
     * Seals, re-seals (refused), rotates, unseals and shreds with both sealers on identical memory;
     * returns {@code null} if every byte and every answer agreed, else the first difference.
     */
    static String sealBothWays(PoolGeometry g, Function<PoolGeometry, PageMemory> gpuMemoryFactory, long seed) {
        SplittableRandom r = new SplittableRandom(seed);
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int tenant = tenants.register("tenant-a");
        try (TenantKeyring keyring = TenantKeyring.open(RootKeySource.ephemeral(), "pool-x", 0, tenants);
                PageMemory cpuMemory = OffHeapPageMemory.allocate(g);
                PageMemory gpuMemory = gpuMemoryFactory.apply(g);
                PageMemory original = OffHeapPageMemory.allocate(g); Arena arena = Arena.ofConfined()) {
            HostPageSealer cpu = new HostPageSealer(new SealLedger(keyring, g.pageCount()), cpuMemory);
            CudaPageSealer gpu = new CudaPageSealer(new SealLedger(keyring, g.pageCount()), (PageKeystreamXor) gpuMemory);
            KernelDifferential.fillRandom(r, g, arena, cpuMemory, gpuMemory, original);
            int[] first = {g.pageCount() - 1, 0};
            int[] firstGens = {7, 1 + r.nextInt(1 << 30)};
            int epoch1 = cpu.seal(tenant, first, firstGens, 0, 2);
            if (gpu.seal(tenant, first, firstGens, 0, 2) != epoch1) {
                return "epochs differ";
            }
            String diff = differ(g, arena, cpuMemory, gpuMemory, "seal");
            if (diff != null) {
                return diff;
            }
            assertThrows(ProtectionException.class, () -> gpu.seal(tenant, first, firstGens, 0, 1), "second seal, same generation");
            diff = differ(g, arena, cpuMemory, gpuMemory, "refused re-seal");
            if (diff != null) {
                return diff;
            }
            int epoch2 = keyring.rotate(tenant);
            int[] second = {1};
            int[] secondGens = {3};
            if (cpu.seal(tenant, second, secondGens, 0, 1) != epoch2 || gpu.seal(tenant, second, secondGens, 0, 1) != epoch2) {
                return "seal after rotation did not use epoch " + epoch2;
            }
            diff = differ(g, arena, cpuMemory, gpuMemory, "seal after rotation");
            if (diff != null) {
                return diff;
            }
            cpu.unseal(tenant, epoch1, first, firstGens, 0, 2);
            gpu.unseal(tenant, epoch1, first, firstGens, 0, 2);
            cpu.unseal(tenant, epoch2, second, secondGens, 0, 1);
            gpu.unseal(tenant, epoch2, second, secondGens, 0, 1);
            diff = differ(g, arena, original, gpuMemory, "unseal");
            if (diff != null) {
                return diff;
            }
            gpu.shred(tenant);
            assertFalse(gpu.canSeal(tenant) || cpu.canSeal(tenant), "a shredded tenant can still seal");
            assertFalse(gpu.isEpochAvailable(tenant, epoch2));
            assertThrows(ProtectionException.class, () -> gpu.seal(tenant, new int[] {1}, new int[] {9}, 0, 1));
            return differ(g, arena, original, gpuMemory, "refused seal after shredding");
        }
    }

    private static String differ(PoolGeometry g, Arena arena, PageMemory expected, PageMemory actual, String step) {
        String diff = KernelDifferential.compare(g, arena, expected, actual);
        return diff == null ? null : g + " after " + step + ": " + diff;
    }
}
