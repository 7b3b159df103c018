package dev.kvshield.audit;

import dev.kvshield.audit.internal.Json;
import dev.kvshield.audit.internal.RecordChain;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

/** Reading audit files back: the files a set of paths names, and their records in order. */
public final class AuditLog {
    private AuditLog() {}

    /** One line of an audit file; {@code fields} is null if the line is not a parseable record. */
    public record Line(Path file, int lineNumber, String text, Map<String, Object> fields) {
        public boolean isRecord() {
            return fields != null;
        }

        public String type() {
            return fields.get("type") instanceof String s ? s : "";
        }

        /** A numeric field, or {@code absent} if missing or not a number. */
        public long number(String name, long absent) {
            return fields.get(name) instanceof Long l ? l : absent;
        }

        public String string(String name) {
            return fields.get(name) instanceof String s ? s : null;
        }
    }

    /**
     * The files {@code paths} name, in chain order: a directory stands for its {@code *.jsonl}
     * files sorted by name (rotation numbers them in order); files are taken as given.
     */
    public static List<Path> files(List<Path> paths) throws IOException {
        List<Path> out = new ArrayList<>();
        for (Path p : paths) {
            if (Files.isDirectory(p)) {
                try (Stream<Path> s = Files.list(p)) {
                    s.filter(f -> f.getFileName().toString().endsWith(".jsonl")).sorted().forEach(out::add);
                }
            } else if (Files.isRegularFile(p)) {
                out.add(p);
            } else {
                throw new IOException("no such audit file or directory: " + p);
            }
        }
        return out;
    }

    /** Every non-empty line of the files, parsed where it is a well-formed record line. */
    public static List<Line> read(List<Path> paths) throws IOException {
        List<Line> lines = new ArrayList<>();
        for (Path f : files(paths)) {
            List<String> text = Files.readAllLines(f, StandardCharsets.UTF_8);
            for (int i = 0; i < text.size(); i++) {
                String t = text.get(i);
                if (t.isEmpty()) {
                    continue;
                }
                lines.add(new Line(f, i + 1, t, parse(t)));
            }
        }
        return lines;
    }

    private static Map<String, Object> parse(String text) {
        if (RecordChain.bodyOf(text) == null) {
            return null;
        }
        try {
            Map<String, Object> m = Json.parseObject(text);
            return m.get("seq") instanceof Long && m.get("type") instanceof String ? m : null;
        } catch (IllegalArgumentException e) {
            return null;
        }
    }
}
