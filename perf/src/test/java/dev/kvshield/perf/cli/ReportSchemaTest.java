package dev.kvshield.perf.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.kvshield.perf.report.ReportConfig;
import dev.kvshield.perf.report.ReportData;
import dev.kvshield.perf.report.ReportRunner;
import dev.kvshield.perf.report.ReportWriter;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.testing.TestXorSealer;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A produced {@code report.json} against the table in {@code perf/REPORT-SCHEMA.md}, both ways:
 * every documented field is there with its type, every field there is documented.
 */
class ReportSchemaTest {
    record Field(String type, String meaning) {}

    static Map<String, Field> documented() throws IOException {
        Map<String, Field> fields = new LinkedHashMap<>();
        for (String line : Files.readAllLines(Path.of("REPORT-SCHEMA.md"))) {
            String[] cells = line.split("\\|");
            if (cells.length >= 4 && !cells[1].isBlank() && !cells[1].contains("---") && !cells[1].trim().equals("path")) {
                fields.put(cells[1].trim(), new Field(cells[2].trim(), cells[3].trim()));
            }
        }
        return fields;
    }

    static String[] tinyArgs(Path out, String... extra) {
        List<String> a = new ArrayList<>(List.of("--requests", "8", "--rounds", "2", "--warmup", "0", "--pool-pages", "48", "--layers",
                "1", "--kv-heads", "1", "--head-dim", "8", "--page-size", "4", "--prefix-tokens", "8", "--prompt", "uniform:4:24",
                "--output", "uniform:2:8", "--tenants", "3", "--arrivals", "1", "--resident-prefixes", "1", "--out", out.toString()));
        a.addAll(List.of(extra));
        return a.toArray(new String[0]);
    }

    @Test
    void aReportWithEveryLevelMatchesTheDocumentedSchema(@TempDir Path dir) throws IOException {
        Path jmh = dir.resolve("jmh.json");
        Files.writeString(jmh, """
                [{"benchmark": "dev.kvshield.perf.jmh.AllocateReleaseBenchmark.allocateReleaseStep", "mode": "thrpt",
                  "params": {"batchPages": "64", "level": "ZERO"},
                  "primaryMetric": {"score": 37826.0, "scoreError": "NaN", "scoreUnit": "ops/s"},
                  "secondaryMetrics": {"gc.alloc.rate.norm": {"score": 0.26, "scoreUnit": "B/op"}}}]
                """);
        ReportConfig config = ReportCommand.config(tinyArgs(dir, "--jmh", jmh.toString()));
        ReportData data = new ReportRunner(config, null, Availability.<dev.kvshield.protection.PageSealerFactory>of(ctx -> new TestXorSealer(ctx.memory())),
                Availability.unavailable("no raw cipher in this test")).run();
        ReportWriter.write(data, dir);
        JsonNode root = new ObjectMapper().readTree(dir.resolve("report.json").toFile());
        check(root, documented());
        assertEquals(5, root.get("levels").size());
        for (JsonNode level : root.get("levels")) {
            assertEquals("measured", level.get("status").asText(), level.toString());
            assertEquals(0, level.get("leaks").asInt(), "a well-behaved engine leaks nothing: " + level);
        }
        assertEquals(3 * 5, root.get("incidents").size());
        assertEquals("AllocateReleaseBenchmark.allocateReleaseStep", root.get("jmh").get(0).get("benchmark").asText());
        assertEquals(0.26, root.get("jmh").get(0).get("allocatedBytesPerOp").asDouble());
        for (JsonNode incident : root.get("incidents")) {
            boolean stock = incident.get("level").asText().equals("stock");
            assertEquals(stock, incident.get("leakedResponses").asInt() > 0, incident.toString());
        }
    }

    @Test
    void aSkippedLevelCarriesOnlyItsReason(@TempDir Path dir) throws IOException {
        ReportConfig config = ReportCommand.config(tinyArgs(dir, "--levels", "zero,encrypt"));
        ReportData data = new ReportRunner(config, null, Availability.unavailable("no key source in this test"),
                Availability.unavailable("no raw cipher in this test")).run();
        ReportWriter.write(data, dir);
        JsonNode root = new ObjectMapper().readTree(dir.resolve("report.json").toFile());
        check(root, documented());
        JsonNode encrypt = root.get("levels").get(2);
        assertEquals("encrypt", encrypt.get("level").asText());
        assertEquals("skipped", encrypt.get("status").asText());
        assertTrue(encrypt.get("skipReason").asText().contains("no key source in this test"));
        assertTrue(root.get("skipped").toString().contains("level encrypt"));
    }

    static void check(JsonNode root, Map<String, Field> doc) {
        List<String> problems = new ArrayList<>();
        walk("", root, doc, problems, root);
        for (Map.Entry<String, Field> e : doc.entrySet()) {
            if (!present(root, e.getKey()) && required(e.getValue(), root)) {
                problems.add("documented field missing: " + e.getKey());
            }
        }
        assertTrue(problems.isEmpty(), String.join("\n", problems));
    }

    private static boolean required(Field f, JsonNode root) {
        boolean synthetic = root.get("trace").get("source").asText().startsWith("synthetic");
        if (f.meaning().startsWith("synthetic only")) {
            return synthetic;
        }
        if (f.meaning().startsWith("CSV only")) {
            return !synthetic;
        }
        return !f.meaning().startsWith("skipped only");
    }

    /** True if the path exists somewhere (for arrays: in at least one element, or the array is empty). */
    private static boolean present(JsonNode node, String path) {
        if (path.isEmpty()) {
            return true;
        }
        int dot = path.indexOf('.');
        String head = dot < 0 ? path : path.substring(0, dot);
        String rest = dot < 0 ? "" : path.substring(dot + 1);
        boolean array = head.endsWith("[]");
        JsonNode child = node.get(array ? head.substring(0, head.length() - 2) : head);
        if (child == null) {
            return false;
        }
        if (!array) {
            return present(child, rest);
        }
        for (JsonNode element : child) {
            if (present(element, rest)) {
                return true;
            }
        }
        return child.isEmpty(); // an empty array's element fields cannot be missing
    }

    private static void walk(String path, JsonNode node, Map<String, Field> doc, List<String> problems, JsonNode root) {
        if (!path.isEmpty()) {
            Field f = doc.get(path);
            if (f == null) {
                problems.add("undocumented field: " + path);
                return;
            }
            if (!typeMatches(f.type(), node)) {
                problems.add(path + ": documented as " + f.type() + " but is " + node);
                return;
            }
            if (f.type().startsWith("SPREAD") || node.isNull()) {
                return;
            }
        }
        boolean hasChildren = path.isEmpty() || doc.keySet().stream().anyMatch(k -> k.startsWith(path + ".") || k.startsWith(path + "[]"));
        if (!hasChildren) {
            return;
        }
        if (node.isObject()) {
            node.properties().forEach(e -> walk(path.isEmpty() ? e.getKey() : path + "." + e.getKey(), e.getValue(), doc, problems, root));
        } else if (node.isArray()) {
            for (JsonNode element : node) {
                element.properties().forEach(e -> walk(path + "[]." + e.getKey(), e.getValue(), doc, problems, root));
            }
        }
    }

    private static boolean typeMatches(String type, JsonNode n) {
        if (type.endsWith(" or null")) {
            return n.isNull() || typeMatches(type.substring(0, type.length() - " or null".length()), n);
        }
        return switch (type) {
            case "integer" -> n.isIntegralNumber();
            case "number" -> n.isNumber();
            case "string" -> n.isTextual();
            case "boolean" -> n.isBoolean();
            case "object" -> n.isObject();
            case "array" -> n.isArray();
            case "SPREAD" -> n.isObject() && n.size() == 3 && n.get("median").isNumber() && n.get("min").isNumber()
                    && n.get("max").isNumber() && n.get("min").asDouble() <= n.get("median").asDouble()
                    && n.get("median").asDouble() <= n.get("max").asDouble();
            default -> throw new IllegalArgumentException("REPORT-SCHEMA.md uses an unknown type: " + type);
        };
    }
}
