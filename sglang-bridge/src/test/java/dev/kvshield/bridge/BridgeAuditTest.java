package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditVerifier;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** COMPLIANCE through the bridge writes the pool's signed audit trail, or the bridge refuses to start naming the missing setting. */
class BridgeAuditTest {
    private static final int PAGE = 4;

    @TempDir
    Path dir;

    private static PoolGeometry geometry() {
        return PoolGeometry.builder().mha(1, 1, 4, 4).pageSizeTokens(PAGE).pageCount(9).build();
    }

    private Map<String, String> settings(String level, boolean key, boolean trail) throws IOException {
        Map<String, String> s = new HashMap<>(Map.of(BridgeSettings.LEVEL, level, BridgeSettings.POOL_ID, "p",
                BridgeSettings.ADVERTISED_CONTEXT_TOKENS, "32"));
        if (key) {
            Path keys = Files.createDirectories(dir.resolve("keys"));
            if (!Files.exists(keys.resolve(AuditKeys.PRIVATE_FILE))) {
                AuditKeys.generate(keys);
            }
            s.put(BridgeSettings.AUDIT_SIGNING_KEY, keys.resolve(AuditKeys.PRIVATE_FILE).toString());
        }
        if (trail) {
            s.put(BridgeSettings.AUDIT_DIR, dir.resolve("trail").toString());
        }
        return s;
    }

    @Test
    void complianceWithoutEitherAuditSettingRefusesNamingIt() throws IOException {
        IllegalArgumentException noDir = assertThrows(IllegalArgumentException.class,
                () -> BridgeSettings.parse(settings("COMPLIANCE", true, false)));
        assertEquals("COMPLIANCE writes a signed audit trail; auditDir is not set", noDir.getMessage());
        IllegalArgumentException noKey = assertThrows(IllegalArgumentException.class,
                () -> BridgeSettings.parse(settings("COMPLIANCE", false, true)));
        assertEquals("COMPLIANCE writes a signed audit trail; auditSigningKey is not set", noKey.getMessage());
        IllegalArgumentException half = assertThrows(IllegalArgumentException.class,
                () -> BridgeSettings.parse(settings("ZERO", false, true)));
        assertEquals("the audit trail needs both auditSigningKey and auditDir; auditSigningKey is not set", half.getMessage());
        BridgeSettings.parse(settings("ZERO", false, false)); // other levels may run without a trail
    }

    @Test
    void aRestartedComplianceServerStartsItsOwnTrailBesideTheEarlierOne() throws IOException {
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry())) {
            for (int boot = 1; boot <= 2; boot++) { // the same settings and directory, as a restarted server has them
                SlotAllocator a = SlotAllocator.create(settings("COMPLIANCE", true, true), geometry(), memory);
                SlotAllocators.allocate(a, 7, a.tenantId("acme"), PAGE);
                a.endStep();
                a.close();
            }
        }
        List<String> names;
        try (Stream<Path> s = Files.list(dir.resolve("trail"))) {
            names = s.map(p -> p.getFileName().toString()).sorted().toList();
        }
        assertTrue(names.stream().anyMatch(n -> n.startsWith("audit-p-r0-boot1-"))
                && names.stream().anyMatch(n -> n.startsWith("audit-p-r0-boot2-")), names.toString());
        for (String boot : List.of("boot1", "boot2")) {
            List<Path> trail = names.stream().filter(n -> n.contains(boot)).map(n -> dir.resolve("trail").resolve(n)).toList();
            AuditVerifier.Report r = AuditVerifier.verify(trail,
                    AuditKeys.loadPublicKey(dir.resolve("keys").resolve(AuditKeys.PUBLIC_FILE)));
            assertTrue(r.ok(), boot + ": " + r.problems());
        }
    }

    /**
     * Two servers given one audit directory, whose ranks name their pools alike (the bridge's pool id is the rank's
     * name), wrote their trails there as two boots of one pool: the second took boot2 while the first still wrote
     * boot1, and each trail shipped its checkpoints between the other's. {@code audit verify --shipped} then failed the
     * first server's whole, untouched trail as an older boot's (a newer trail of its pool and rank shipped after it),
     * so a trail could be verified only with {@code --trail}, which turns that check off for both. A pool's trail is
     * now written by one allocator at a time: the second refuses to start, naming the directory, pool and rank; a
     * restart (the first closed) still starts its own trail beside.
     */
    @Test
    void aSecondServerWritingTheSamePoolAndRanksTrailsInOneDirectoryIsRefusedNamingIt() throws IOException {
        Path collected = dir.resolve("shipped.jsonl");
        Map<String, String> s = settings("COMPLIANCE", true, true);
        s.put(BridgeSettings.AUDIT_SHIP, "file:" + collected);
        try (OffHeapPageMemory memoryA = OffHeapPageMemory.allocate(geometry());
                OffHeapPageMemory memoryB = OffHeapPageMemory.allocate(geometry())) {
            SlotAllocator a = SlotAllocator.create(s, geometry(), memoryA);
            SlotAllocators.allocate(a, 7, a.tenantId("acme"), PAGE);
            a.endStep();
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> {
                SlotAllocator b = SlotAllocator.create(s, geometry(), memoryB);
                SlotAllocators.allocate(b, 9, b.tenantId("globex"), PAGE);
                b.endStep();
                b.close();
            });
            assertTrue(e.getMessage().contains(dir.resolve("trail") + " already has a writer of pool p rank 0's trails"),
                    e.getMessage());
            a.close();
            AuditVerifier.Report r = AuditVerifier.verify(List.of(dir.resolve("trail")),
                    AuditKeys.loadPublicKey(dir.resolve("keys").resolve(AuditKeys.PUBLIC_FILE)),
                    Files.readAllLines(collected, StandardCharsets.UTF_8));
            assertTrue(r.ok(), "the first server's trail: " + r.problems());
            SlotAllocator restarted = SlotAllocator.create(s, geometry(), memoryB);
            restarted.close();
        }
        try (Stream<Path> files = Files.list(dir.resolve("trail"))) {
            assertTrue(files.anyMatch(f -> f.getFileName().toString().startsWith("audit-p-r0-boot2-")), "a restart's trail");
        }
    }

    @Test
    void complianceWritesASignedTrailOfEveryPageEvent() throws IOException {
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry())) {
            SlotAllocator a = SlotAllocator.create(settings("COMPLIANCE", true, true), geometry(), memory);
            int tenant = a.tenantId("acme");
            int[] pages = SlotAllocators.allocate(a, 7, tenant, 2 * PAGE);
            ByteBuffer io = SlotAllocators.bind(a);
            for (int i = 0; i < pages.length; i++) {
                for (int k = 0; k < PAGE; k++) {
                    io.putLong((i * PAGE + k) * 8, (long) pages[i] * PAGE + k);
                }
            }
            assertEquals(0, a.free(2 * PAGE, tenant, 7, 0));
            a.endStep();
            a.close();
            List<Path> files;
            try (Stream<Path> s = Files.list(dir.resolve("trail"))) {
                files = s.sorted().toList();
            }
            assertFalse(files.isEmpty(), "no trail written");
            assertTrue(files.get(0).getFileName().toString().startsWith("audit-p-r0-boot1-"), files.toString());
            AuditVerifier.Report r = AuditVerifier.verify(List.of(dir.resolve("trail")),
                    AuditKeys.loadPublicKey(dir.resolve("keys").resolve(AuditKeys.PUBLIC_FILE)));
            assertTrue(r.ok(), r.problems().toString());
            List<String> lines = new ArrayList<>();
            for (Path f : files) {
                lines.addAll(Files.readAllLines(f, StandardCharsets.UTF_8));
            }
            for (int page : pages) {
                for (String type : List.of("allocate", "release", "free")) {
                    assertTrue(lines.stream().anyMatch(l -> l.contains("\"type\":\"" + type + "\"") && l.matches(".*\"pages\":\\[.*\\[" + page + ",.*")),
                            () -> "no " + type + " record of page " + page + " in " + lines);
                }
            }
        }
    }

    @Test
    void anUnusableSigningKeyRefusesNamingTheSettings() throws IOException {
        Map<String, String> s = settings("COMPLIANCE", true, true);
        Path key = Path.of(s.get(BridgeSettings.AUDIT_SIGNING_KEY));
        Files.setPosixFilePermissions(key, java.nio.file.attribute.PosixFilePermissions.fromString("rw-r--r--"));
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry())) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> SlotAllocator.create(s, geometry(), memory));
            assertTrue(e.getMessage().startsWith("auditSigningKey/auditDir cannot be used: audit signing key "), e.getMessage());
        }
    }

    @Test
    void everyCheckpointIsShippedWhereAuditShipNamesAndABadTargetIsRefusedNamingIt() throws IOException {
        Map<String, String> s = settings("COMPLIANCE", true, true);
        Path collected = dir.resolve("collected.jsonl");
        s.put(BridgeSettings.AUDIT_SHIP, "log, file:" + collected);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry())) {
            SlotAllocator a = SlotAllocator.create(s, geometry(), memory);
            int tenant = a.tenantId("acme");
            SlotAllocators.allocate(a, 7, tenant, PAGE);
            a.endStep();
            a.close();
        }
        List<String> shipped = Files.readAllLines(collected, StandardCharsets.UTF_8);
        assertTrue(!shipped.isEmpty() && shipped.getLast().contains("\"final\":true"), shipped.toString());
        AuditVerifier.Report r = AuditVerifier.verify(List.of(dir.resolve("trail")),
                AuditKeys.loadPublicKey(dir.resolve("keys").resolve(AuditKeys.PUBLIC_FILE)), shipped);
        assertTrue(r.ok(), r.problems().toString());
        for (String bad : List.of("syslog", "file:", "log,,file:x")) {
            s.put(BridgeSettings.AUDIT_SHIP, bad);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> BridgeSettings.parse(s));
            assertTrue(e.getMessage().startsWith("auditShip ships checkpoints to 'log' or 'file:PATH'") && e.getMessage().contains(bad),
                    e.getMessage());
        }
    }

    @Test
    void aFinishedRequestIsSummarisedUnderItsLabelAndBadArgumentsAreRefusedNamingThem() throws IOException {
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(geometry())) {
            SlotAllocator a = SlotAllocator.create(settings("COMPLIANCE", true, true), geometry(), memory);
            int tenant = a.tenantId("acme");
            SlotAllocators.allocate(a, 7, tenant, PAGE);
            a.releaseRequest(0, tenant, 7, true, 0);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> a.requestFinished(tenant, -3, false, "r"));
            assertTrue(e.getMessage().startsWith("request id -3 names no request"), e.getMessage());
            a.requestFinished(tenant, 7, true, "client-rid-7");
            a.endStep();
            a.close();
        }
        List<String> summaries = new ArrayList<>();
        try (Stream<Path> files = Files.list(dir.resolve("trail"))) {
            for (Path f : files.sorted().toList()) {
                Files.readAllLines(f, StandardCharsets.UTF_8).stream().filter(l -> l.contains("\"type\":\"summary\"")).forEach(summaries::add);
            }
        }
        assertEquals(1, summaries.size(), summaries::toString);
        assertTrue(summaries.getFirst().contains("\"outcome\":\"aborted\"") && summaries.getFirst().contains("\"label\":\"client-rid-7\""),
                summaries.getFirst());
    }
}
