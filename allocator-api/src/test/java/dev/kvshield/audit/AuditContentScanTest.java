package dev.kvshield.audit;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * No key bytes and no KV content in anything the audit trail writes: every produced file (records
 * and shipped checkpoints) is scanned for the signing key and the KV canary in raw, hex and base64
 * forms. The planted twin puts the canary into a record and the scan must find it.
 */
class AuditContentScanTest {
    private static final byte[] CANARY = "PROMPT:the-quarterly-numbers".getBytes(StandardCharsets.US_ASCII);

    @TempDir
    Path dir;

    /** Every form a secret could take in a text file. */
    private static List<byte[]> forms(byte[] secret) {
        List<byte[]> f = new ArrayList<>();
        f.add(secret);
        f.add(HexFormat.of().formatHex(secret).getBytes(StandardCharsets.US_ASCII));
        f.add(HexFormat.of().formatHex(secret).toUpperCase(Locale.ROOT).getBytes(StandardCharsets.US_ASCII));
        f.add(Base64.getEncoder().encodeToString(secret).replace("=", "").getBytes(StandardCharsets.US_ASCII));
        return f;
    }

    private static boolean contains(byte[] hay, byte[] needle) {
        outer:
        for (int i = 0; i + needle.length <= hay.length; i++) {
            for (int j = 0; j < needle.length; j++) {
                if (hay[i + j] != needle[j]) {
                    continue outer;
                }
            }
            return true;
        }
        return false;
    }

    /** The files that contain any form of any secret. */
    private static List<String> scan(Path root, List<byte[]> secrets) throws IOException {
        List<String> hits = new ArrayList<>();
        try (Stream<Path> files = Files.walk(root)) {
            for (Path f : files.filter(Files::isRegularFile).toList()) {
                byte[] content = Files.readAllBytes(f);
                for (byte[] s : secrets) {
                    for (byte[] form : forms(s)) {
                        if (contains(content, form)) {
                            hits.add(f.getFileName() + " holds " + new String(form, StandardCharsets.ISO_8859_1));
                        }
                    }
                }
            }
        }
        return hits;
    }

    private Path produce(Path keyDir) throws IOException {
        Path out = dir.resolve("produced");
        AuditKeys.generate(keyDir);
        AuditKeys.SigningKey key = AuditKeys.loadSigningKey(keyDir.resolve(AuditKeys.PRIVATE_FILE));
        try (TestPools p = TestPools.create(9, ProtectionLevel.COMPLIANCE); Arena arena = Arena.ofConfined()) {
            AuditTrail trail = AuditTrail.attach(p.pool, AuditFixtures.config(out.resolve("trail"), key, 2048)
                    .checkpointEveryRecords(5).shipper(CheckpointShipper.appendingTo(out.resolve("shipped.jsonl"))).build());
            int a = p.pool.tenants().register("alice");
            long[] h = new long[2];
            for (int r = 0; r < 6; r++) {
                long owner = Owners.request(r);
                p.pool.allocate(a, owner, LeaseKind.OWNER, 2, h, 0);
                for (long handle : h) {
                    // 32 bytes per buffer and page: the canary's first 32 bytes, padded
                    MemorySegment kv = arena.allocate(4L * AuditFixtures.TOKEN_BYTES);
                    kv.copyFrom(MemorySegment.ofArray(Arrays.copyOf(CANARY, 32)));
                    p.pool.write(a, owner, handle, 0, 0, kv);
                    p.pool.read(a, owner, handle, 0, 0, arena.allocate(kv.byteSize()));
                    assertEquals(CANARY[0], kv.get(ValueLayout.JAVA_BYTE, 0));
                }
                p.pool.release(a, owner, h, 0, 2, ReleaseReason.FINISHED);
                trail.requestFinished(a, r, RequestOutcome.COMPLETED);
                p.pool.endStep();
            }
            trail.close();
        }
        return out;
    }

    private static List<byte[]> secrets(Path keyDir) throws IOException {
        String pem = Files.readString(keyDir.resolve(AuditKeys.PRIVATE_FILE));
        String b64 = pem.substring(pem.indexOf("-----BEGIN PRIVATE KEY-----") + 27, pem.indexOf("-----END PRIVATE KEY-----"));
        byte[] pkcs8 = Base64.getMimeDecoder().decode(b64);
        byte[] seed = Arrays.copyOfRange(pkcs8, pkcs8.length - 32, pkcs8.length);
        return List.of(pkcs8, seed, Arrays.copyOf(CANARY, 16), Arrays.copyOfRange(CANARY, 8, 24));
    }

    @Test
    void producedFilesHoldNoKeyBytesAndNoKvContent() throws IOException {
        Path keyDir = dir.resolve("keys");
        Path out = produce(keyDir);
        assertTrue(Files.size(out.resolve("shipped.jsonl")) > 0, "checkpoints were shipped");
        assertTrue(AuditLog.read(List.of(out.resolve("trail"))).size() > 50);
        assertEquals(List.of(), scan(out, secrets(keyDir)));
        assertEquals("rw-------", java.nio.file.attribute.PosixFilePermissions.toString(
                Files.getPosixFilePermissions(keyDir.resolve(AuditKeys.PRIVATE_FILE))));
    }

    @Test
    void theScanFindsAPlantedCanary() throws IOException {
        Path keyDir = dir.resolve("keys");
        Path out = produce(keyDir);
        Path first = AuditLog.files(List.of(out.resolve("trail"))).getFirst();
        List<String> lines = new ArrayList<>(Files.readAllLines(first));
        // Planted bug: a record that carries KV bytes, as a careless "debug" field would.
        lines.set(1, lines.get(1).replace("\"type\":", "\"kv\":\"" + HexFormat.of().formatHex(CANARY) + "\",\"type\":"));
        Files.write(first, lines);
        List<String> hits = scan(out, secrets(keyDir));
        assertFalse(hits.isEmpty());
        assertTrue(hits.getFirst().startsWith(first.getFileName().toString()), hits.toString());
    }
}
