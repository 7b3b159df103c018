package dev.kvshield.audit;

import static dev.kvshield.audit.PageEventType.ALLOCATE;
import static dev.kvshield.audit.PageEventType.READ;
import static dev.kvshield.audit.PageEventType.REJECT_FOREIGN;
import static dev.kvshield.audit.PageEventType.RELEASE;
import static dev.kvshield.audit.PageEventType.WRITE;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.internal.Json;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The page and request histories (one trail's at a time; a request found by its label), the exposure
 * report's wording and window, key handling and usage errors of the command line, and records with
 * values no trail writes.
 */
class AuditToolTest {
    @TempDir
    Path dir;

    private record Result(int status, String out, String err) {}

    private static Result run(String... args) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int status = AuditTool.run(args, new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(err, true, StandardCharsets.UTF_8));
        return new Result(status, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
    }

    @SuppressWarnings("unchecked")
    private static List<Map<String, Object>> jsonArray(String text) {
        return (List<Map<String, Object>>) Json.parseObject("{\"a\":" + text.strip() + "}").get("a");
    }

    @Test
    void pageAndRequestHistories() throws IOException {
        Path trail = dir.resolve("trail");
        AuditFixtures.closedTrail(trail, AuditKeys.generateInMemory(), 4);
        Result page = run("page", "1", "--json", trail.toString());
        assertEquals(0, page.status(), page.err());
        List<Map<String, Object>> records = jsonArray(page.out());
        assertTrue(records.stream().allMatch(r -> Long.valueOf(1).equals(r.get("page"))));
        Set<Object> types = records.stream().map(r -> r.get("type")).collect(Collectors.toSet());
        assertTrue(types.containsAll(Set.of("allocate", "write", "read", "release", "protect_issued", "protect_done", "free")), types.toString());
        Result request = run("request", "101", "--json", trail.toString());
        List<Map<String, Object>> history = jsonArray(request.out());
        assertTrue(history.stream().allMatch(r -> Long.valueOf(101).equals(r.get("req"))));
        assertEquals("summary", history.getLast().get("type"));
        assertEquals(Long.valueOf(1), history.stream().filter(r -> r.get("tenant") != null).map(r -> r.get("tenant")).distinct()
                .findFirst().orElseThrow(), "request 101 is bob's (tenant 1)");
        Result text = run("request", "101", trail.toString());
        assertTrue(text.out().strip().endsWith(history.size() + " record(s) for request 101"), text.out());
    }

    @Test
    void keysAreOwnerOnlyAndNeverOverwritten() throws IOException {
        Path keys = dir.resolve("keys");
        assertEquals(0, run("keygen", "--out", keys.toString()).status());
        assertEquals(2, run("keygen", "--out", keys.toString()).status(), "refuses to overwrite");
        Path priv = keys.resolve(AuditKeys.PRIVATE_FILE);
        AuditKeys.loadSigningKey(priv);
        Files.setPosixFilePermissions(priv, PosixFilePermissions.fromString("rw-r-----"));
        IOException e = assertThrows(IOException.class, () -> AuditKeys.loadSigningKey(priv));
        assertTrue(e.getMessage().contains("rw-r-----") && e.getMessage().contains("chmod 600"), e.getMessage());
        assertEquals(AuditKeys.loadPublicKey(keys.resolve(AuditKeys.PUBLIC_FILE)), AuditKeys.loadPublicKey(priv));
    }

    @Test
    void usageErrorsExitOne() {
        assertEquals(1, run().status());
        assertEquals(1, run("frobnicate").status());
        assertEquals(1, run("verify", dir.toString()).status(), "verify needs --pubkey");
        assertEquals(1, run("exposure", "--from", "yesterday", dir.toString()).status());
        assertEquals(2, run("exposure", dir.resolve("missing").toString()).status());
    }

    /** The key {@link #trail} signs with. */
    private AuditKeys.SigningKey key = AuditKeys.generateInMemory();

    /** A detached trail of pool-x rank 0 whose tenants 0, 1, ... are {@code names}, writing to {@code dir} under {@code prefix}. */
    private AuditTrail trail(Path dir, String prefix, String... names) throws IOException {
        AuditConfig config = AuditConfig.builder().sink(AuditSink.rotatingFiles(dir, prefix, 1 << 20)).signingKey(key).build();
        return AuditTrail.detached(config, new AuditTrail.Scope("pool-x", 0, 8, 4, ProtectionLevel.NONE, t -> names[t]));
    }

    /** One request's life on page {@code page}: allocated, written, read, released, finished with {@code label}. */
    private static void serve(AuditTrail t, int tenant, long request, int page, String label) {
        long owner = Owners.request(request);
        t.onPageEvent(ALLOCATE, page, 0, tenant, owner, 0);
        t.onPageEvent(WRITE, page, 0, tenant, owner, 4);
        t.onPageEvent(READ, page, 0, tenant, owner, 4);
        t.onPageEvent(RELEASE, page, 0, tenant, owner, ReleaseReason.FINISHED.ordinal());
        t.requestFinished(tenant, request, RequestOutcome.COMPLETED, label);
        t.onStepBoundary(1);
    }

    /** Two boots of one pool side by side: each served its request 0, acme's in boot 1, globex's in boot 2. */
    private Path twoBoots() throws IOException {
        Path audit = dir.resolve("audit");
        try (AuditTrail boot1 = trail(audit, "audit-pool-x-r0-boot1", "acme")) {
            serve(boot1, 0, 0, 2, "rid-of-acme");
        }
        try (AuditTrail boot2 = trail(audit, "audit-pool-x-r0-boot2", "globex")) {
            serve(boot2, 0, 0, 2, "rid-of-globex");
        }
        return audit;
    }

    private static String trailOf(Path audit, String bootPrefix) throws IOException {
        try (var files = Files.list(audit)) {
            Path f = files.filter(p -> p.getFileName().toString().startsWith(bootPrefix)).findFirst().orElseThrow();
            return (String) Json.parseObject(Files.readAllLines(f).getFirst()).get("trail");
        }
    }

    @Test
    void aRequestIdFoundInTwoTrailsIsRefusedNamingBothUntilOneIsChosen() throws IOException {
        Path audit = twoBoots();
        String acmeTrail = trailOf(audit, "audit-pool-x-r0-boot1");
        String globexTrail = trailOf(audit, "audit-pool-x-r0-boot2");
        for (String[] args : List.of(new String[] {"request", "0", "--json", audit.toString()},
                new String[] {"page", "2", audit.toString()})) {
            Result r = run(args);
            assertEquals(1, r.status(), r.out() + r.err());
            assertEquals("", r.out(), "never one merged history");
            assertTrue(r.err().contains(acmeTrail) && r.err().contains(globexTrail) && r.err().contains("--trail"), r.err());
        }
        assertTrue(run("request", "0", audit.toString()).err().contains("request 0 of tenant \"acme\", label \"rid-of-acme\""));

        Result chosen = run("request", "0", "--trail", globexTrail, "--json", audit.toString());
        assertEquals(0, chosen.status(), chosen.err());
        List<Map<String, Object>> events = jsonArray(chosen.out());
        assertFalse(events.isEmpty());
        assertTrue(events.stream().allMatch(e -> globexTrail.equals(e.get("trail"))), chosen.out());
        assertEquals(2, run("request", "0", "--trail", "f".repeat(32), audit.toString()).status(), "no records of that trail");
    }

    @Test
    void aRequestIsFoundByItsLabelAndItsHistoryPrintsTheLabel() throws IOException {
        Path audit = twoBoots();
        String globexTrail = trailOf(audit, "audit-pool-x-r0-boot2");
        Result r = run("request", "rid-of-globex", audit.toString());
        assertEquals(0, r.status(), r.err());
        List<String> lines = r.out().strip().lines().toList();
        assertEquals("trail " + globexTrail + " (pool \"pool-x\" rank 0): request 0 of tenant \"globex\", label \"rid-of-globex\"",
                lines.getFirst());
        assertEquals("5 record(s) for request 0", lines.getLast(), "allocate, write, read, release and the summary");
        Result json = run("request", "rid-of-globex", "--json", audit.toString());
        Map<String, Object> summary = jsonArray(json.out()).getLast();
        assertEquals("summary", summary.get("type"));
        assertEquals("rid-of-globex", summary.get("label"));
        assertEquals("0 record(s) for request \"no-such-rid\"", run("request", "no-such-rid", audit.toString()).out().strip());
    }

    @Test
    void aLabelledTrailVerifiesAndTheLabelIsCoveredByTheChain() throws IOException {
        Path keys = dir.resolve("keys");
        AuditKeys.generate(keys);
        key = AuditKeys.loadSigningKey(keys.resolve(AuditKeys.PRIVATE_FILE));
        Path audit = dir.resolve("audit");
        try (AuditTrail t = trail(audit, "audit", "acme")) {
            serve(t, 0, 7, 1, "client \"rid\" \\ é 🙂");
            t.requestFinished(0, 8, RequestOutcome.ABORTED);
        }
        String pub = keys.resolve(AuditKeys.PUBLIC_FILE).toString();
        Result ok = run("verify", "--pubkey", pub, audit.toString());
        assertEquals(0, ok.status(), ok.out());
        Path file = AuditFixtures.files(audit).getFirst();
        String text = Files.readString(file);
        assertTrue(text.contains(",\"req\":7,\"label\":\"client \\\"rid\\\" \\\\ é 🙂\",\"outcome\":\"completed\""), text);
        assertFalse(text.contains("\"req\":8,\"label\""), "no label: no field");
        Files.writeString(file, text.replace("\\\\ é", "\\\\ e"));
        Result altered = run("verify", "--pubkey", pub, audit.toString());
        assertEquals(2, altered.status(), altered.out());
        assertTrue(altered.out().contains("was altered"), altered.out());
    }

    @Test
    void aLabelIsRefusedIfTooLongOrNotOnePlainLineWithoutEchoingIt() throws IOException {
        try (AuditTrail t = trail(dir.resolve("audit"), "audit", "acme")) {
            String secretish = "s3cret-".repeat(40);
            IllegalArgumentException longOne = assertThrows(IllegalArgumentException.class,
                    () -> t.requestFinished(0, 1, RequestOutcome.COMPLETED, secretish));
            assertEquals("label must be 1 to 256 characters (null: none): length=280", longOne.getMessage());
            assertThrows(IllegalArgumentException.class, () -> t.requestFinished(0, 1, RequestOutcome.COMPLETED, ""));
            IllegalArgumentException control = assertThrows(IllegalArgumentException.class,
                    () -> t.requestFinished(0, 1, RequestOutcome.COMPLETED, "rid\u001b[2Jx"));
            assertEquals("label holds control character U+001B at index 3", control.getMessage());
            IllegalArgumentException surrogate = assertThrows(IllegalArgumentException.class,
                    () -> t.requestFinished(0, 1, RequestOutcome.COMPLETED, "rid\ud83d"));
            assertEquals("label holds an unpaired surrogate at index 3", surrogate.getMessage());
            t.requestFinished(0, 1, RequestOutcome.COMPLETED, "x".repeat(256));
        }
    }

    /**
     * An engine's free outside any request is refused and recorded under request id 2^62 - 1 with no
     * tenant; {@code audit exposure} printed it as {@code tenant  request 4611686018427387903}.
     */
    @Test
    void exposurePrintsAnUnattributedRefusalAsUnattributed() throws IOException {
        Path audit = dir.resolve("audit");
        try (AuditTrail t = trail(audit, "audit", "acme")) {
            t.onPageEvent(ALLOCATE, 3, 0, 0, Owners.request(5), 0);
            t.onPageEvent(REJECT_FOREIGN, 3, 0, -1, Owners.UNATTRIBUTED, 0x1234);
            t.onPageEvent(REJECT_FOREIGN, 3, 0, 0, Owners.request(6), 0x1234);
        }
        Result r = run("exposure", audit.toString());
        assertEquals(0, r.status(), r.err());
        assertTrue(r.out().contains(" reject_foreign unattributed page 3 gen 0"), r.out());
        assertTrue(r.out().contains(" reject_foreign tenant acme request 6 page 3 gen 0"), r.out());
        assertFalse(r.out().contains(Long.toString(Owners.UNATTRIBUTED)), r.out());
        assertTrue(run("exposure", "--json", audit.toString()).out().contains("\"tenant\":\"\",\"request\":-1,\"namespace\":-1"));
    }

    @Test
    void anExposureWindowEndingBeforeItStartsIsAUsageError() throws IOException {
        Path audit = dir.resolve("audit");
        try (AuditTrail t = trail(audit, "audit", "acme")) {
            serve(t, 0, 1, 1, null);
        }
        Result r = run("exposure", "--from", "2026-12-07T12:00:00Z", "--to", "2026-12-07T11:00:00Z", audit.toString());
        assertEquals(1, r.status(), r.out());
        assertEquals("", r.out(), "no report of an empty window");
        assertTrue(r.err().contains("--from 2026-12-07T12:00:00Z is later than --to 2026-12-07T11:00:00Z"), r.err());
        assertEquals(0, run("exposure", "--from", "5", "--to", "5", audit.toString()).status(), "a one-millisecond window is fine");
    }

    /**
     * Lines that parse as records but hold values no trail writes (any writer of the directory can add
     * them): an impossible geometry, a slot range before slot 0, an id out of range, a count past 2^31.
     * The exposure query counts what it cannot use and still reports; nothing throws out of it.
     */
    @Test
    void exposureCountsRecordsWithImpossibleValuesAndStillReports() throws IOException {
        Path audit = dir.resolve("audit");
        try (AuditTrail t = trail(audit, "audit", "acme")) {
            serve(t, 0, 1, 1, null);
        }
        String common = ",\"trail\":\"" + "a".repeat(32) + "\",\"pool\":\"pool-x\",\"rank\":0,\"step\":9";
        String hash = ",\"hash\":\"" + "0".repeat(64) + "\"}";
        List<String> hostile = List.of(
                "{\"seq\":90,\"type\":\"open\"" + common + ",\"pageCount\":-1,\"slotsPerPage\":4" + hash,
                "{\"seq\":91,\"type\":\"open\"" + common + ",\"pageCount\":1099511627776,\"slotsPerPage\":4096" + hash,
                "{\"seq\":92,\"type\":\"write\"" + common + ",\"tenant\":0,\"req\":1,\"slots\":[-5,3],\"pages\":[[1,0]]" + hash,
                "{\"seq\":93,\"type\":\"read\"" + common + ",\"tenant\":0,\"req\":9223372036854775807,\"slots\":[0,4],\"pages\":[[1,0]]"
                        + hash,
                "{\"seq\":94,\"type\":\"reject_foreign\"" + common + ",\"tenant\":0,\"req\":2,\"pages\":[[1,0,4294967296]]" + hash,
                "{\"seq\":95,\"type\":\"reader_added\"" + common + ",\"tenant\":0,\"reader\":-7,\"pages\":[[1,0]]" + hash);
        Files.write(AuditFixtures.files(audit).getLast(), hostile, StandardCharsets.UTF_8, StandardOpenOption.APPEND);
        Result r = run("exposure", "--json", audit.toString());
        assertEquals(0, r.status(), r.err());
        assertTrue(r.out().endsWith(",\"unparsedLines\":3}\n"), r.out());
        Result page = run("page", "1", audit.toString());
        assertEquals(2, page.status(), page.out());
        assertTrue(page.err().contains(":" + (Files.readAllLines(AuditFixtures.files(audit).getLast()).size() - 1)
                + ": seq 94: malformed pages entry [1, 0, 4294967296]"), page.err());
    }
}
