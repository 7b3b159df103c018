package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.cipher.BouncyChaCha;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.PageMemoryConformanceTest;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** The CPU sealer byte for byte against Bouncy Castle's ChaCha20 over many page geometries. */
class HostPageSealerTest {
    @TempDir
    Path dir;

    static List<PoolGeometry> geometries() {
        List<PoolGeometry> all = new ArrayList<>(PageMemoryConformanceTest.geometries());
        all.add(PoolGeometry.builder().mla(2, 576, 2).pageSizeTokens(3).pageCount(5).build());
        all.add(PoolGeometry.builder().layers(3).buffers(List.of(BufferKind.K, BufferKind.V), 6, 10).pageSizeTokens(7).pageCount(4)
                .build());
        all.add(PoolGeometry.builder().mha(1, 8, 128, 2).pageSizeTokens(32).pageCount(3).build());
        return all;
    }

    @ParameterizedTest
    @MethodSource("geometries")
    void sealMatchesBouncyCastleForEveryRegionAndUnsealRestoresIt(PoolGeometry g) {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int tenant = tenants.register("t" + g.hashCode());
        SplittableRandom random = new SplittableRandom(g.hashCode());
        try (PageMemory memory = OffHeapPageMemory.allocate(g);
                TenantKeyring keyring = TenantKeyring.open(RootKeySource.ephemeral(), "pool-g", 1, tenants)) {
            HostPageSealer sealer = new HostPageSealer(new SealLedger(keyring, g.pageCount()), memory);
            byte[][][] plain = new byte[g.pageCount()][g.bufferCount()][];
            for (int p = 0; p < g.pageCount(); p++) {
                for (int b = 0; b < g.bufferCount(); b++) {
                    plain[p][b] = new byte[(int) g.pageBytes(b)];
                    for (int i = 0; i < plain[p][b].length; i++) {
                        plain[p][b][i] = (byte) random.nextInt(256);
                    }
                    MemorySegment.copy(plain[p][b], 0, memory.hostRegion(p, b), ValueLayout.JAVA_BYTE, 0, plain[p][b].length);
                }
            }
            int[] pages = {g.pageCount() - 1, 0};
            int[] generations = {7, 1 + random.nextInt(1 << 30)};
            int epoch = sealer.seal(tenant, pages, generations, 0, 2);
            byte[] key = TestKeys.keyBytes(keyring, tenant, epoch);
            for (int p = 0; p < g.pageCount(); p++) {
                for (int b = 0; b < g.bufferCount(); b++) {
                    byte[] expected = plain[p][b].clone();
                    int listed = p == pages[0] ? 0 : p == pages[1] ? 1 : -1;
                    if (listed >= 0) {
                        BouncyChaCha.xor(key, p, generations[listed], b, 0, expected);
                    }
                    assertArrayEquals(expected, EncryptFixture.raw(memory, p, b), g + " page " + p + " buffer " + b);
                }
            }
            assertThrows(ProtectionException.class, () -> sealer.seal(tenant, pages, generations, 0, 1), "second seal");
            sealer.unseal(tenant, epoch, pages, generations, 0, 2);
            for (int p = 0; p < g.pageCount(); p++) {
                for (int b = 0; b < g.bufferCount(); b++) {
                    assertArrayEquals(plain[p][b], EncryptFixture.raw(memory, p, b), "unsealed page " + p + " buffer " + b);
                }
            }
        }
    }
}
