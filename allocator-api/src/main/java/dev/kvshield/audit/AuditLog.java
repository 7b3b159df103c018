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

        /**
         * The page events this record lists, in order: its {@code pages} entries
         * ({@code [page, gen]}, or {@code [page, gen, times]} for an event that repeated in a row),
         * or a format-1 record's single {@code page} and {@code gen}; empty for a record that lists
         * no page event (open, tenant, summary, checkpoint).
         *
         * @throws IllegalArgumentException naming the record if an entry is not 2 or 3 integers a
         *     trail can write (32-bit page and generation, times in {@code [1, 2^31)})
         */
        public List<PageEntry> pages() {
            Object pages = fields.get("pages");
            if (pages == null) {
                if (fields.get("page") instanceof Long page) {
                    return List.of(new PageEntry(page, number("gen", 0), 1));
                }
                // Format 1 wrote no page for an event about a malformed handle.
                return isEventType(type()) ? List.of(new PageEntry(-1, 0, 1)) : List.of();
            }
            if (!(pages instanceof List<?> list)) {
                throw new IllegalArgumentException("seq " + number("seq", -1) + ": 'pages' is not a list");
            }
            List<PageEntry> entries = new ArrayList<>(list.size());
            for (Object o : list) {
                if (!(o instanceof List<?> e) || e.size() < 2 || e.size() > 3 || !(e.get(0) instanceof Long page && isInt(page))
                        || !(e.get(1) instanceof Long gen && isInt(gen))
                        || e.size() == 3 && !(e.get(2) instanceof Long t && t >= 1 && t <= Integer.MAX_VALUE)) {
                    throw new IllegalArgumentException("seq " + number("seq", -1) + ": malformed pages entry " + o
                            + " (expected [page, gen] or [page, gen, times >= 1], 32-bit integers)");
                }
                entries.add(new PageEntry(page, gen, e.size() == 3 ? (Long) e.get(2) : 1));
            }
            return entries;
        }
    }

    private static boolean isInt(long v) {
        return v == (int) v;
    }

    private static boolean isEventType(String type) {
        for (PageEventType t : PageEventType.values()) {
            if (t.name().equalsIgnoreCase(type)) {
                return true;
            }
        }
        return false;
    }

    /** One page event of a record: the page, its generation, and how many times the event repeated in a row. */
    public record PageEntry(long page, long generation, long times) {}

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

    /**
     * Every non-empty line of the files, parsed where it is a well-formed record line. Bytes that are not
     * UTF-8 (a record edited or corrupted) read as U+FFFD, so the line is still there to fail its hash.
     */
    public static List<Line> read(List<Path> paths) throws IOException {
        List<Line> lines = new ArrayList<>();
        for (Path f : files(paths)) {
            List<String> text = new String(Files.readAllBytes(f), StandardCharsets.UTF_8).lines().toList();
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
