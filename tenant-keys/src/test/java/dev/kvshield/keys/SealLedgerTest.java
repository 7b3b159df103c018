package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.TenantRegistry;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.opentest4j.AssertionFailedError;

class SealLedgerTest {
    @TempDir
    Path dir;

    private TenantKeyring keyring;
    private SealLedger ledger;
    private int alice;
    private int bob;

    @BeforeEach
    void setUp() {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        alice = tenants.register("alice");
        bob = tenants.register("bob");
        keyring = TenantKeyring.open(RootKeySource.keyFile(TestKeys.keyFile(dir, "k", TestKeys.sequential(32, 5), "rw-------")), "p", 0,
                tenants);
        ledger = new SealLedger(keyring, 8);
    }

    @AfterEach
    void tearDown() {
        keyring.close();
    }

    private void assertUnchanged(int[] pages, int[] sealedBy, int[] generations) {
        for (int i = 0; i < pages.length; i++) {
            assertEquals(sealedBy[i], ledger.sealedBy(pages[i]), "page " + pages[i] + " owner changed by a refused call");
            assertEquals(generations[i], ledger.highestSealedGeneration(pages[i]), "page " + pages[i] + " generation changed");
        }
    }

    @Test
    void aPageIsSealedAtMostOncePerGenerationAndARefusedBatchChangesNothing() {
        assertEquals(0, ledger.beginSeal(alice, new int[] {1, 2}, new int[] {5, 5}, 0, 2));
        ProtectionException again = assertThrows(ProtectionException.class,
                () -> ledger.beginSeal(alice, new int[] {3, 2}, new int[] {1, 5}, 0, 2));
        assertTrue(again.getMessage().contains("page 2 at generation 5") && again.getMessage().contains("at most once"),
                again.getMessage());
        assertUnchanged(new int[] {1, 2, 3}, new int[] {alice, alice, -1}, new int[] {5, 5, 0});
        assertThrows(ProtectionException.class, () -> ledger.beginSeal(bob, new int[] {1}, new int[] {4}, 0, 1), "older generation");
        assertThrows(ProtectionException.class, () -> ledger.beginSeal(bob, new int[] {4, 4}, new int[] {1, 2}, 0, 2), "listed twice");
        assertThrows(ProtectionException.class, () -> ledger.beginSeal(bob, new int[] {8}, new int[] {1}, 0, 1), "out of range");
        assertThrows(IllegalArgumentException.class, () -> ledger.beginSeal(bob, new int[] {1}, new int[] {1}, 0, 2));
        assertUnchanged(new int[] {1, 2, 4}, new int[] {alice, alice, -1}, new int[] {5, 5, 0});
        // A rotated key does not make a second use of the same (page, generation) acceptable either.
        keyring.rotate(alice);
        assertThrows(ProtectionException.class, () -> ledger.beginSeal(alice, new int[] {1}, new int[] {5}, 0, 1));
        assertEquals(1, ledger.beginSeal(alice, new int[] {1}, new int[] {6}, 0, 1));
    }

    @Test
    void unsealNeedsTheExactTenantEpochAndGenerationAndAnAvailableEpoch() {
        ledger.beginSeal(alice, new int[] {1, 2}, new int[] {3, 3}, 0, 2);
        assertThrows(ProtectionException.class, () -> ledger.beginUnseal(bob, 0, new int[] {1}, new int[] {3}, 0, 1));
        assertThrows(ProtectionException.class, () -> ledger.beginUnseal(alice, 0, new int[] {1}, new int[] {2}, 0, 1));
        assertThrows(ProtectionException.class, () -> ledger.beginUnseal(alice, 1, new int[] {1}, new int[] {3}, 0, 1));
        assertThrows(ProtectionException.class, () -> ledger.beginUnseal(alice, 0, new int[] {1, 3}, new int[] {3, 3}, 0, 2));
        assertUnchanged(new int[] {1, 2}, new int[] {alice, alice}, new int[] {3, 3});
        ledger.beginUnseal(alice, 0, new int[] {1}, new int[] {3}, 0, 1);
        assertEquals(-1, ledger.sealedBy(1));
        assertThrows(ProtectionException.class, () -> ledger.beginUnseal(alice, 0, new int[] {1}, new int[] {3}, 0, 1), "twice");
        keyring.rotate(alice);
        keyring.retireEpoch(alice, 0);
        assertThrows(KeyUnavailableException.class, () -> ledger.beginUnseal(alice, 0, new int[] {2}, new int[] {3}, 0, 1));
        assertEquals(alice, ledger.sealedBy(2));
    }

    /** Seals page 3 (all bytes 0x41) while the key is shredded between ledger and XOR; returns page 3's raw buffers. */
    private byte[][] sealWhileShredding(boolean zeroPagesWorks) {
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(EncryptFixture.SMALL)) {
            for (int b = 0; b < EncryptFixture.SMALL.bufferCount(); b++) {
                memory.hostRegion(3, b).fill((byte) 0x41);
            }
            LedgerPageSealer sealer = new LedgerPageSealer(new SealLedger(keyring, EncryptFixture.SMALL.pageCount())) {
                @Override
                protected void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                    keyring.shred(tenant);
                    TestKeys.keyBytes(keyring, tenant, epoch);
                }

                @Override
                protected void zeroPages(int[] pages, int offset, int count) {
                    if (zeroPagesWorks) {
                        memory.scrub(pages, offset, count);
                    }
                }
            };
            ProtectionException e = assertThrows(ProtectionException.class, () -> sealer.seal(alice, new int[] {3}, new int[] {2}, 0, 1));
            assertTrue(e.getMessage().contains("zeroed instead"), e.getMessage());
            assertThrows(ProtectionException.class, () -> sealer.seal(alice, new int[] {3}, new int[] {2}, 0, 1), "no retry");
            byte[][] raw = new byte[EncryptFixture.SMALL.bufferCount()][];
            for (int b = 0; b < raw.length; b++) {
                raw[b] = EncryptFixture.raw(memory, 3, b);
            }
            return raw;
        }
    }

    private static void assertAllBuffersZero(byte[][] raw) {
        for (int b = 0; b < raw.length; b++) {
            EncryptFixture.assertAllZero(raw[b], "buffer " + b);
        }
    }

    @Test
    void aKeyShreddedBetweenLedgerAndXorLeavesZerosNotPlaintext() {
        assertAllBuffersZero(sealWhileShredding(true));
    }

    @Test
    void plantedBugASealerThatCannotZeroLeavesPlaintextAndIsCaught() {
        byte[][] raw = sealWhileShredding(false);
        assertThrows(AssertionFailedError.class, () -> assertAllBuffersZero(raw));
    }

    @Test
    void shredCountsTheTenantsSealedPagesAndStopsItsSeals() {
        ledger.beginSeal(alice, new int[] {1, 2, 3}, new int[] {1, 1, 1}, 0, 3);
        ledger.beginUnseal(alice, 0, new int[] {2}, new int[] {1}, 0, 1);
        ledger.beginSeal(bob, new int[] {4}, new int[] {1}, 0, 1);
        assertEquals(2, ledger.shred(alice));
        assertThrows(KeyUnavailableException.class, () -> ledger.beginSeal(alice, new int[] {5}, new int[] {1}, 0, 1));
        assertThrows(KeyUnavailableException.class, () -> ledger.beginUnseal(alice, 0, new int[] {1}, new int[] {1}, 0, 1));
        assertEquals(-1, ledger.sealedBy(5));
        ledger.beginUnseal(bob, 0, new int[] {4}, new int[] {1}, 0, 1);
    }
}
