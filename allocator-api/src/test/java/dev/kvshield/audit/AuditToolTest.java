package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.internal.Json;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The page and request histories, key handling and usage errors of the command line. */
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
}
