package dev.kvshield.keys;

import static dev.kvshield.keys.EncryptFixture.SMALL;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Leases;
import io.micrometer.core.instrument.Meter;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.opentest4j.AssertionFailedError;

/**
 * Key bytes never reach logs, exception messages, toString, metrics or page events: every key
 * operation (and its failures) runs with logs captured, and the captured text is searched for the
 * hex and base64 of the root key and of every data key, whole and in 6-byte windows.
 */
class KeyHygieneTest {
    @TempDir
    Path dir;

    private final List<String> text = new ArrayList<>();

    private void expectFailure(Runnable r) {
        try {
            r.run();
            fail("expected a failure");
        } catch (RuntimeException e) {
            StringWriter trace = new StringWriter();
            e.printStackTrace(new PrintWriter(trace));
            text.add(trace.toString());
        }
    }

    @Test
    void noKeyBytesInLogsExceptionsToStringMetricsOrEvents() {
        byte[] rootBytes = TestKeys.sequential(32, 0x9A);
        List<byte[]> keys = new ArrayList<>();
        keys.add(rootBytes);
        Path keyFile = TestKeys.keyFile(dir, "root.key", rootBytes, "rw-------");
        HostPageSealerFactory factory = new HostPageSealerFactory(RootKeySource.keyFile(keyFile));
        EncryptFixture.Events events = new EncryptFixture.Events();
        try (TestKeys.LogCapture logs = new TestKeys.LogCapture(); PageMemory memory = OffHeapPageMemory.allocate(SMALL)) {
            KvPagePool pool = EncryptFixture.encryptPool(memory, factory, "pool-h", 0, events);
            int alice = pool.tenants().register("alice");
            int bob = pool.tenants().register("bob");
            TenantKeyring keyring = factory.keyring("pool-h", 0);
            long owner = Owners.request(1);
            long[] leases = new long[2];
            assertTrue(pool.allocate(alice, owner, LeaseKind.OWNER, 2, leases, 0));
            long[] handles = Leases.handles(pool, leases);
            EncryptFixture.writePage(pool, alice, owner, leases[0], PageHandles.page(handles[0]), 1);
            pool.release(alice, owner, leases, 0, 2, ReleaseReason.FINISHED);
            pool.endStep();
            keys.add(TestKeys.keyBytes(keyring, alice, 0));
            keyring.rotate(alice);
            keys.add(TestKeys.keyBytes(keyring, alice, 1));
            keyring.currentEpoch(bob);
            keys.add(TestKeys.keyBytes(keyring, bob, 0));
            long[] out = new long[1];
            pool.reclaim(alice, owner, LeaseKind.OWNER, new long[] {PageHandles.sealedReference(handles[0])}, 0, 1, out, 0);
            pool.reclaim(bob, owner, LeaseKind.OWNER, new long[] {PageHandles.sealedReference(handles[1])}, 0, 1, out, 0);
            expectFailure(() -> keyring.retireEpoch(alice, 1));
            keyring.retireEpoch(alice, 0);
            expectFailure(() -> TestKeys.keyBytes(keyring, alice, 0));
            expectFailure(() -> factory.keyring("pool-h", 0).copyKeyForKernelLaunchDangerously(alice, 9, memory.hostRegion(1, 0)));
            pool.shredTenant(alice);
            expectFailure(() -> keyring.rotate(alice));
            expectFailure(() -> keyring.currentEpoch(alice));
            expectFailure(() -> TestKeys.keyBytes(keyring, alice, 1));
            HostPageSealer sealer = new HostPageSealer(new SealLedger(keyring, SMALL.pageCount()), memory);
            expectFailure(() -> sealer.seal(alice, new int[] {1}, new int[] {99}, 0, 1));
            expectFailure(() -> sealer.unseal(bob, 0, new int[] {2}, new int[] {99}, 0, 1));
            TestKeys.keyFile(dir, "loose.key", rootBytes, "rw-r--r--");
            expectFailure(() -> RootKeySource.keyFile(dir.resolve("loose.key")).load());
            TestKeys.keyFile(dir, "long.key", TestKeys.sequential(33, 0x9A), "rw-------");
            expectFailure(() -> RootKeySource.keyFile(dir.resolve("long.key")).load());
            text.add(keyring.toString());
            text.add(sealer.toString());
            text.add(keyring.keyId(bob, 0));
            text.add(keyring.rootKeyId());
            try (RootKey root = RootKeySource.keyFile(keyFile).load()) {
                text.add(root.toString());
            }
            for (Meter meter : pool.config().meterRegistry().getMeters()) {
                text.add(meter.getId().toString());
            }
            pool.close();
            keyring.close();
            text.addAll(logs.messages());
        }
        assertTrue(text.stream().anyMatch(t -> t.contains("crypto-shredded")), "the capture saw the shred log");
        assertTrue(text.stream().anyMatch(t -> t.contains("rw-r--r--")), "the capture saw the key-file refusal");
        assertEquals(4, keys.size());
        assertNoKeyMaterial(text, keys);
        for (EncryptFixture.Event e : events.all) {
            if (e.type() == PageEventType.SEAL || e.type() == PageEventType.RECLAIM || e.type() == PageEventType.SHRED) {
                assertTrue(e.detail() >= 0 && e.detail() <= 1, "event detail is an epoch: " + e);
            }
        }
    }

    @Test
    void plantedBugAKeyLoggedInHexOrBase64IsFound() {
        byte[] key = TestKeys.sequential(32, 0x33);
        System.Logger log = System.getLogger("planted.bug");
        String[] leaks = {"derived key " + HexFormat.of().formatHex(key, 4, 12),
            "key=" + Base64.getEncoder().encodeToString(key), "K:" + HexFormat.of().withUpperCase().formatHex(key)};
        for (String leak : leaks) {
            try (TestKeys.LogCapture logs = new TestKeys.LogCapture()) {
                log.log(System.Logger.Level.DEBUG, leak);
                List<String> captured = logs.messages();
                assertThrows(AssertionFailedError.class, () -> assertNoKeyMaterial(captured, List.of(key)), leak);
            }
        }
    }

    private static void assertNoKeyMaterial(List<String> captured, List<byte[]> keys) {
        String all = String.join("\n", captured);
        for (byte[] key : keys) {
            for (String encoding : encodings(key)) {
                assertFalse(all.contains(encoding), "key material leaked as '" + encoding + "'");
            }
        }
    }

    /** Hex (both cases) and base64 (standard and URL-safe) of the whole key and of every 6-byte window. */
    private static List<String> encodings(byte[] key) {
        List<String> out = new ArrayList<>();
        for (int from = 0; from + 6 <= key.length; from++) {
            String hex = HexFormat.of().formatHex(key, from, from + 6);
            out.add(hex);
            out.add(hex.toUpperCase(Locale.ROOT));
            byte[] window = java.util.Arrays.copyOfRange(key, from, from + 6);
            out.add(Base64.getEncoder().encodeToString(window));
            out.add(Base64.getUrlEncoder().encodeToString(window));
        }
        out.add(Base64.getEncoder().withoutPadding().encodeToString(key));
        out.add(Base64.getUrlEncoder().withoutPadding().encodeToString(key));
        return out;
    }
}
