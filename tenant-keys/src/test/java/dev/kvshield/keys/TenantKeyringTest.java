package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.tenant.TenantRegistry;
import dev.kvshield.tenant.UnknownTenantException;
import java.io.ByteArrayOutputStream;
import java.lang.foreign.Arena;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.Set;
import org.bouncycastle.crypto.digests.SHA256Digest;
import org.bouncycastle.crypto.generators.HKDFBytesGenerator;
import org.bouncycastle.crypto.params.HKDFParameters;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class TenantKeyringTest {
    @TempDir
    Path dir;

    private RootKeySource source;
    private final byte[] rootBytes = TestKeys.sequential(32, 0x40);
    private TenantRegistry tenants;
    private int alice;
    private int bob;

    @BeforeEach
    void setUp() {
        source = RootKeySource.keyFile(TestKeys.keyFile(dir, "root.key", rootBytes, "rw-------"));
        tenants = new TenantRegistry((name, policy) -> { });
        alice = tenants.register("alice");
        bob = tenants.register("bob");
    }

    /** The documented derivation, computed independently with Bouncy Castle's HKDF generator. */
    private static byte[] expectedKey(byte[] root, String tenant, int epoch, String poolId, int rank, byte[] bootNonce) {
        ByteArrayOutputStream info = new ByteArrayOutputStream();
        for (byte[] field : new byte[][] {"kvshield/page-key/v1".getBytes(StandardCharsets.UTF_8),
                tenant.getBytes(StandardCharsets.UTF_8), ByteBuffer.allocate(4).putInt(epoch).array(),
                poolId.getBytes(StandardCharsets.UTF_8), ByteBuffer.allocate(4).putInt(rank).array(), bootNonce}) {
            info.writeBytes(ByteBuffer.allocate(4).putInt(field.length).array());
            info.writeBytes(field);
        }
        HKDFBytesGenerator hkdf = new HKDFBytesGenerator(new SHA256Digest());
        hkdf.init(new HKDFParameters(root, "kvshield/page-key-salt/v1".getBytes(StandardCharsets.UTF_8), info.toByteArray()));
        byte[] key = new byte[32];
        hkdf.generateBytes(key, 0, 32);
        return key;
    }

    @Test
    void dataKeysFollowTheDocumentedDerivation() {
        try (TenantKeyring keyring = TenantKeyring.open(source, "pool-a", 3, tenants)) {
            assertEquals(16, keyring.bootNonce().length);
            assertEquals(0, keyring.currentEpoch(alice));
            assertArrayEquals(expectedKey(rootBytes, "alice", 0, "pool-a", 3, keyring.bootNonce()), TestKeys.keyBytes(keyring, alice, 0));
            assertEquals(1, keyring.rotate(alice));
            assertArrayEquals(expectedKey(rootBytes, "alice", 1, "pool-a", 3, keyring.bootNonce()), TestKeys.keyBytes(keyring, alice, 1));
            assertEquals(0, keyring.rotate(bob) - 1, "a tenant's first rotation creates epoch 0 then 1");
            assertArrayEquals(expectedKey(rootBytes, "bob", 1, "pool-a", 3, keyring.bootNonce()), TestKeys.keyBytes(keyring, bob, 1));
        }
    }

    @Test
    void twoPoolsTwoRanksTwoBootsTwoTenantsAndTwoEpochsNeverShareAKey() {
        Set<String> keys = new HashSet<>();
        int made = 0;
        for (String pool : new String[] {"pool-a", "pool-b"}) {
            for (int rank = 0; rank < 2; rank++) {
                for (int boot = 0; boot < 2; boot++) {
                    try (TenantKeyring keyring = TenantKeyring.open(source, pool, rank, tenants)) {
                        keyring.rotate(alice);
                        keyring.rotate(bob);
                        for (int tenant : new int[] {alice, bob}) {
                            for (int epoch = 0; epoch < 2; epoch++) {
                                keys.add(HexFormat.of().formatHex(TestKeys.keyBytes(keyring, tenant, epoch)));
                                made++;
                            }
                        }
                    }
                }
            }
        }
        assertEquals(32, made);
        assertEquals(made, keys.size(), "some key repeated");
    }

    @Test
    void rotationKeepsOldEpochsUntilRetired() {
        try (TenantKeyring keyring = TenantKeyring.open(source, "p", 0, tenants)) {
            assertEquals(0, keyring.currentEpoch(alice));
            assertEquals(1, keyring.rotate(alice));
            assertEquals(1, keyring.currentEpoch(alice));
            assertTrue(keyring.isEpochAvailable(alice, 0));
            assertTrue(keyring.isEpochAvailable(alice, 1));
            IllegalArgumentException current = assertThrows(IllegalArgumentException.class, () -> keyring.retireEpoch(alice, 1));
            assertTrue(current.getMessage().contains("current epoch"), current.getMessage());
            assertThrows(IllegalArgumentException.class, () -> keyring.retireEpoch(alice, 2));
            keyring.retireEpoch(alice, 0);
            keyring.retireEpoch(alice, 0);
            assertFalse(keyring.isEpochAvailable(alice, 0));
            assertTrue(keyring.isEpochAvailable(alice, 1));
            KeyUnavailableException gone = assertThrows(KeyUnavailableException.class, () -> TestKeys.keyBytes(keyring, alice, 0));
            assertTrue(gone.getMessage().contains("epoch 0") && gone.getMessage().contains("alice"), gone.getMessage());
            assertFalse(keyring.isEpochAvailable(bob, 0), "bob has no key until first use");
        }
    }

    @Test
    void shredDestroysEveryEpochForGood() {
        try (TenantKeyring keyring = TenantKeyring.open(source, "p", 0, tenants)) {
            keyring.rotate(alice);
            keyring.currentEpoch(bob);
            assertTrue(keyring.canSeal(alice));
            assertEquals(2, keyring.shred(alice));
            assertTrue(keyring.isShredded(alice));
            assertFalse(keyring.canSeal(alice));
            assertFalse(keyring.isEpochAvailable(alice, 0));
            assertFalse(keyring.isEpochAvailable(alice, 1));
            assertThrows(KeyUnavailableException.class, () -> keyring.currentEpoch(alice));
            assertThrows(KeyUnavailableException.class, () -> keyring.rotate(alice));
            assertThrows(KeyUnavailableException.class, () -> TestKeys.keyBytes(keyring, alice, 1));
            assertTrue(keyring.canSeal(bob), "shredding one tenant leaves the others");
            assertTrue(keyring.isEpochAvailable(bob, 0));
            assertEquals(0, keyring.shred(alice));
        }
    }

    @Test
    void closeDestroysEveryKeyAndRefusesLaterUse() {
        TenantKeyring keyring = TenantKeyring.open(source, "p", 0, tenants);
        keyring.currentEpoch(alice);
        keyring.close();
        keyring.close();
        assertFalse(keyring.canSeal(alice));
        assertFalse(keyring.isEpochAvailable(alice, 0));
        assertThrows(KeyUnavailableException.class, () -> TestKeys.keyBytes(keyring, alice, 0));
        assertThrows(KeyUnavailableException.class, () -> keyring.currentEpoch(alice));
    }

    @Test
    void refusesUnknownTenantsBadArgumentsAndShortDestinations() {
        try (TenantKeyring keyring = TenantKeyring.open(source, "p", 0, tenants); Arena arena = Arena.ofConfined()) {
            assertThrows(UnknownTenantException.class, () -> keyring.currentEpoch(7));
            assertThrows(UnknownTenantException.class, () -> keyring.shred(7));
            assertFalse(keyring.canSeal(7));
            keyring.currentEpoch(alice);
            assertThrows(IllegalArgumentException.class, () -> keyring.copyKeyForKernelLaunchDangerously(alice, 0, arena.allocate(31)));
            assertTrue(keyring.keyId(alice, 0).startsWith(keyring.rootKeyId() + "/p/rank0/alice/e0"), keyring.keyId(alice, 0));
        }
        assertThrows(IllegalArgumentException.class, () -> TenantKeyring.open(source, "", 0, tenants));
        assertThrows(IllegalArgumentException.class, () -> TenantKeyring.open(source, "p", -1, tenants));
    }

    /** The data key of {@code tenant}'s current epoch. */
    private static byte[] key(TenantKeyring keyring, int tenant) {
        return TestKeys.keyBytes(keyring, tenant, keyring.currentEpoch(tenant));
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
}
