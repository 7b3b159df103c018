package dev.kvshield.perf.report;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Reads a JMH result file ({@code -rf json}) so the report can fold benchmark figures in: per
 * benchmark and parameter set, the primary score and, when run with {@code -prof gc}, the bytes
 * allocated per operation.
 */
public final class JmhResults {
    private JmhResults() {}

    public static List<Map<String, Object>> read(Path file) {
        JsonNode root;
        try {
            root = new ObjectMapper().readTree(file.toFile());
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read JMH results " + file, e);
        }
        if (!root.isArray()) {
            throw new IllegalArgumentException(file + " is not a JMH JSON result file (expected an array of results)");
        }
        List<Map<String, Object>> out = new ArrayList<>();
        for (JsonNode r : root) {
            Map<String, Object> m = new LinkedHashMap<>();
            String benchmark = r.path("benchmark").asText();
            m.put("benchmark", benchmark.substring(benchmark.lastIndexOf('.', benchmark.lastIndexOf('.') - 1) + 1));
            Map<String, Object> params = new LinkedHashMap<>();
            r.path("params").properties().forEach(e -> params.put(e.getKey(), e.getValue().asText()));
            m.put("params", params);
            m.put("mode", r.path("mode").asText());
            JsonNode primary = r.path("primaryMetric");
            m.put("score", primary.path("score").asDouble());
            m.put("scoreError", primary.path("scoreError").isNumber() ? primary.path("scoreError").asDouble() : null);
            m.put("unit", primary.path("scoreUnit").asText());
            JsonNode gc = r.path("secondaryMetrics").path("gc.alloc.rate.norm");
            m.put("allocatedBytesPerOp", gc.isMissingNode() ? null : gc.path("score").asDouble());
            out.add(m);
        }
        return out;
    }
}
