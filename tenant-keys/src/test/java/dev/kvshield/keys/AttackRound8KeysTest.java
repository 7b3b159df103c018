package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.Arrays;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Attack round 8 on tenant-keys: each test failed before its fix (the defect it names is in its javadoc). */
class AttackRound8KeysTest {
    @TempDir
    Path dir;

    private static byte[] key(TenantKeyring keyring, int tenant) {
        int epoch = keyring.currentEpoch(tenant);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment dst = arena.allocate(TenantKeyring.KEY_BYTES);
            keyring.copyKeyForKernelLaunchDangerously(tenant, epoch, dst);
            return dst.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    /**
     * Promise (TenantKeyring javadoc): one key per (tenant, epoch), "two pools, two ranks, two processes
     * or two boots never share a key"; tenants are told apart by their registered name (TenantRegistry:
     * "each with a stable name (the key-derivation identity)"). The brief: "one tenant's key must not
     * decrypt another's pages".
     *
     * <p>Was: the derivation encodes the tenant name with String.getBytes(UTF_8), which silently
     * replaces every unpaired surrogate with '?'. TenantRegistry accepted any non-blank name, so three
     * DISTINCT tenants "acme?", "acme\uD800" and "acme\uDC00" all derive the SAME data key (and the
     * same key id text in the logs, where the surrogate prints as '?'): each can decrypt the others'
     * sealed pages, and crypto-shredding one of them does not make what it left behind noise, since a
     * live tenant still derives the very same key. (The audit trail also writes every lone surrogate
     * as '?', RecordChain.escaped, so its tenant records and key ids cannot tell them apart either.)
     */
    @Test
    void namesThatEncodeAlikeAreRefusedAndDistinctNamesDeriveDistinctKeys() {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int plain = tenants.register("acme?");
        int replacement = tenants.register("acme\uFFFD");
        IllegalArgumentException high = assertThrows(IllegalArgumentException.class, () -> tenants.register("acme\uD800"));
        assertTrue(high.getMessage().contains("U+D800") && high.getMessage().contains("index 4"), high.getMessage());
        assertThrows(IllegalArgumentException.class, () -> tenants.register("acme\uDC00"));
        IllegalArgumentException control = assertThrows(IllegalArgumentException.class, () -> tenants.register("acme\nINFO forged"));
        assertFalse(control.getMessage().contains("\n"), "the message carries no raw control character");
        assertEquals(2, tenants.size(), "refused names registered nothing");
        RootKeySource source = RootKeySource.keyFile(TestKeys.keyFile(dir, "root.key", TestKeys.sequential(32, 0x11), "rw-------"));
        try (TenantKeyring keyring = TenantKeyring.open(source, "pool-0", 0, tenants)) {
            assertFalse(Arrays.equals(key(keyring, plain), key(keyring, replacement)), "'acme?' and 'acme\\uFFFD' share one data key");
        }
    }

    /**
     * Promise (KvPagePool.shredTenant javadoc): "Crypto-shreds a tenant: destroys its keys through the
     * sealer and makes every page it sealed unreclaimable (each reported as a SHRED event with its
     * epoch). @return the number of sealed pages that became unrecoverable". SealedPages.shred says
     * the same ("makes every page it sealed unreclaimable (one SHRED event each, with its epoch)").
     *
     * <p>Was: a page the tenant released in the current step is already sealed (synchronous
     * quarantine: the ciphertext is in memory under the tenant's key) but still QUARANTINED until the
     * step boundary. shredTenant walks only the SEALED list, so that page is neither counted nor
     * reported: it returns 0 and emits no SHRED event; after endStep the page enters SEALED recorded
     * as reclaimable by the shredded tenant (view().sealedFor(page) == alice) with a SEAL event
     * emitted AFTER the shred. The audit trail (and the caller's count) miss a shredded page.
     */
    @Test
    void shredMissesAPageSealedInTheCurrentStep() {
        RootKeySource source = RootKeySource.keyFile(TestKeys.keyFile(dir, "root.key", TestKeys.sequential(32, 0x22), "rw-------"));
        HostPageSealerFactory factory = new HostPageSealerFactory(source);
        EncryptFixture.Events events = new EncryptFixture.Events();
        try (PageMemory memory = OffHeapPageMemory.allocate(EncryptFixture.SMALL);
                KvPagePool pool = EncryptFixture.encryptPool(memory, factory, "pool-s", 0, events)) {
            int alice = pool.tenants().register("alice");
            long owner = Owners.request(1);
            long[] lease = new long[1];
            assertTrue(pool.allocate(alice, owner, LeaseKind.OWNER, 1, lease, 0));
            int page = pool.view().pageOf(lease[0]);
            EncryptFixture.writePage(pool, alice, owner, lease[0], page, 5);
            pool.release(alice, owner, lease, 0, 1, ReleaseReason.FINISHED);
            assertTrue(events.of(PageEventType.PROTECT_ISSUED).stream().anyMatch(e -> e.page() == page)
                    && events.of(PageEventType.SEAL).isEmpty(), "precondition: the page's seal was issued in this step, not yet collected");

            int shredded = pool.shredTenant(alice);
            pool.endStep();

            assertEquals(PageState.SEALED, pool.view().stateOf(page));
            assertEquals(-1, pool.view().sealedFor(page),
                    "after the shred the page is still recorded as reclaimable by the shredded tenant");
            assertEquals(1, events.of(PageEventType.SHRED).size(), "no SHRED event for a page alice sealed before the shred");
            assertEquals(1, shredded, "shredTenant did not count the page alice sealed in this step");
        }
    }
}
