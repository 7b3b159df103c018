package dev.kvshield.audit;

import dev.kvshield.audit.internal.Json;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Path;
import java.time.Instant;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Predicate;

/**
 * The {@code ./kvshield audit} command: {@code verify}, {@code exposure}, {@code page},
 * {@code request}, {@code keygen}. The histories print one JSON object per page event (a record's
 * fields with its {@code pages} list replaced by the event's {@code page}, {@code gen} and, for an
 * event repeated in a row, {@code times}), so every event is reconstructed from the records. Exit status 0 when all is well, 2 when a verification fails (or
 * a path is not an audit log), 1 for usage errors. {@code --json} prints exactly one JSON document.
 */
public final class AuditTool {
    static final int OK = 0;
    static final int USAGE = 1;
    static final int BAD = 2;
    private static final String USAGE_TEXT = """
            usage: ./kvshield audit <command>
              verify --pubkey FILE [--shipped FILE] [--trail ID] [--json] PATH...
                                                         check one trail: the hash chain, every checkpoint signature,
                                                         the final checkpoint sealing its tail, one trail id throughout
                                                         (--shipped: checkpoint lines collected off the host must be in the
                                                         log, and no newer trail of this pool and rank shipped after it;
                                                         --trail: the files must be this trail)
              exposure [--from T] [--to T] [--json] PATH...
                                                         requests that read another tenant's data or unwritten slots,
                                                         and the attempts that were blocked (T: ISO-8601 instant or epoch ms)
              page PAGE [--json] PATH...                 the history of one page, one line per page event
              request ID [--json] PATH...                the history of one request, one line per event
              keygen --out DIR                           write an Ed25519 signing key (mode 600) and its public key
            PATH: an audit file, or a directory of them (rotated files are read in name order)""";

    private AuditTool() {}

    public static void main(String[] args) {
        System.exit(run(args, System.out, System.err));
    }

    /** Runs one command; returns the exit status. */
    public static int run(String[] args, PrintStream out, PrintStream err) {
        if (args.length == 0) {
            err.println(USAGE_TEXT);
            return USAGE;
        }
        Options o;
        try {
            o = Options.parse(args);
        } catch (IllegalArgumentException e) {
            err.println("kvshield audit: " + e.getMessage());
            err.println(USAGE_TEXT);
            return USAGE;
        }
        try {
            return switch (args[0]) {
                case "verify" -> verify(o, out);
                case "exposure" -> exposure(o, out, err);
                case "page" -> history(o, out, "page");
                case "request" -> history(o, out, "request");
                case "keygen" -> keygen(o, out);
                default -> {
                    err.println("kvshield audit: unknown command '" + args[0] + "' (allowed: verify, exposure, page, request, keygen)");
                    yield USAGE;
                }
            };
        } catch (IOException e) {
            err.println("kvshield audit: " + e.getMessage());
            return BAD;
        } catch (IllegalArgumentException e) {
            err.println("kvshield audit: " + e.getMessage());
            return USAGE;
        }
    }

    private record Options(String command, List<Path> paths, List<String> positional, Map<String, String> values, boolean json) {
        static Options parse(String[] args) {
            List<Path> paths = new ArrayList<>();
            List<String> positional = new ArrayList<>();
            Map<String, String> values = new LinkedHashMap<>();
            boolean json = false;
            boolean needsId = args[0].equals("page") || args[0].equals("request");
            for (int i = 1; i < args.length; i++) {
                String a = args[i];
                switch (a) {
                    case "--json" -> json = true;
                    case "--pubkey", "--shipped", "--trail", "--from", "--to", "--out" -> {
                        if (i + 1 >= args.length) {
                            throw new IllegalArgumentException(a + " needs a value");
                        }
                        values.put(a, args[++i]);
                    }
                    default -> {
                        if (a.startsWith("--")) {
                            throw new IllegalArgumentException("unknown option '" + a + "'");
                        }
                        if (needsId && positional.isEmpty()) {
                            positional.add(a);
                        } else {
                            paths.add(Path.of(a));
                        }
                    }
                }
            }
            return new Options(args[0], paths, positional, values, json);
        }

        List<Path> requirePaths() {
            if (paths.isEmpty()) {
                throw new IllegalArgumentException(command + " needs at least one PATH");
            }
            return paths;
        }

        String require(String option) {
            String v = values.get(option);
            if (v == null) {
                throw new IllegalArgumentException(command + " needs " + option);
            }
            return v;
        }
    }

    private static int verify(Options o, PrintStream out) throws IOException {
        String shipped = o.values().get("--shipped");
        AuditVerifier.Report r = AuditVerifier.verify(o.requirePaths(), AuditKeys.loadPublicKey(Path.of(o.require("--pubkey"))),
                shipped == null ? List.of() : java.nio.file.Files.readAllLines(Path.of(shipped)), o.values().get("--trail"));
        String trail = r.trail() == null ? "trail (none named)" : "trail " + r.trail();
        if (o.json()) {
            Map<String, Object> doc = new LinkedHashMap<>();
            doc.put("ok", r.ok());
            doc.put("trail", r.trail());
            doc.put("firstBadSeq", r.firstBadSeq());
            doc.put("records", r.records());
            doc.put("checkpoints", r.checkpoints());
            doc.put("problems", r.problems());
            out.println(Json.toJson(doc));
        } else if (r.ok()) {
            out.println("OK: " + trail + ": " + r.records() + " records, " + r.checkpoints()
                    + " checkpoints, chain intact, all signatures valid, sealed by its final checkpoint");
        } else {
            out.println("FAILED: " + trail + ": first bad seq " + r.firstBadSeq() + " (" + r.records() + " records, " + r.checkpoints()
                    + " checkpoints)");
            r.problems().forEach(p -> out.println("  " + p));
        }
        return r.ok() ? OK : BAD;
    }

    private static int exposure(Options o, PrintStream out, PrintStream err) throws IOException {
        long from = time(o.values().get("--from"), Long.MIN_VALUE);
        long to = time(o.values().get("--to"), Long.MAX_VALUE);
        List<AuditLog.Line> lines = AuditLog.read(o.requirePaths());
        if (lines.stream().noneMatch(AuditLog.Line::isRecord)) {
            throw new IOException("no audit records in " + o.paths());
        }
        ExposureQuery.Report r = ExposureQuery.run(lines, from, to);
        if (o.json()) {
            out.println(r.toJson());
        } else {
            out.println("leaked: " + r.exposed().size() + " request(s) read another tenant's data or unwritten slots");
            for (ExposureQuery.Exposure e : r.exposed()) {
                out.println("  pool " + e.pool() + " rank " + e.rank() + " tenant " + e.tenant() + " request " + e.request() + " ("
                        + e.outcome() + "): data of " + (e.sourceTenants().isEmpty() ? "no other tenant" : e.sourceTenants())
                        + ", " + e.foreignSlotReads() + " foreign and " + e.unwrittenSlotReads() + " unwritten slot reads, first at "
                        + Instant.ofEpochMilli(e.firstExposedWallMillis()));
            }
            out.println("stopped: " + r.blocked().size() + " attempt(s) rejected");
            for (ExposureQuery.Blocked b : r.blocked()) {
                out.println("  seq " + b.seq() + " " + Instant.ofEpochMilli(b.wallMillis()) + " " + b.type() + " tenant " + b.tenant()
                        + " request " + b.request() + " page " + b.page() + " gen " + b.generation());
            }
        }
        if (r.unparsedLines() > 0) {
            err.println("kvshield audit: " + r.unparsedLines() + " line(s) were not readable records; run 'audit verify'");
        }
        return OK;
    }

    private static int history(Options o, PrintStream out, String what) throws IOException {
        if (o.positional().isEmpty()) {
            throw new IOException(what + " needs a " + (what.equals("page") ? "PAGE" : "request ID"));
        }
        long id;
        try {
            id = Long.parseLong(o.positional().getFirst());
        } catch (NumberFormatException e) {
            throw new IOException(what + " id must be a number: '" + o.positional().getFirst() + "'");
        }
        boolean byPage = what.equals("page");
        Predicate<AuditLog.Line> ofRequest = l -> l.number("req", -1) == id || l.number("reader", -1) == id
                || l.number("releasedByReq", -1) == id || l.number("fromReq", -1) == id;
        List<AuditLog.Line> lines = AuditLog.read(o.requirePaths());
        if (lines.stream().noneMatch(AuditLog.Line::isRecord)) {
            throw new IOException("no audit records in " + o.paths());
        }
        List<Map<String, Object>> events = new ArrayList<>();
        for (AuditLog.Line l : lines) {
            if (!l.isRecord() || !byPage && !ofRequest.test(l)) {
                continue;
            }
            List<AuditLog.PageEntry> pages;
            try {
                pages = l.pages();
            } catch (IllegalArgumentException e) {
                throw new IOException(l.file().getFileName() + ":" + l.lineNumber() + ": " + e.getMessage() + "; run 'audit verify'");
            }
            if (pages.isEmpty() && !byPage) {
                events.add(l.fields());
            }
            for (AuditLog.PageEntry p : pages) {
                if (!byPage || p.page() == id) {
                    events.add(event(l, p));
                }
            }
        }
        if (o.json()) {
            out.println(Json.toJson(events));
        } else {
            events.forEach(e -> out.println(Json.toJson(e)));
            out.println(events.size() + " record(s) for " + what + " " + id);
        }
        return OK;
    }

    /** One page event of a record: its fields with {@code pages} replaced, in place, by that entry's page, gen (and times). */
    private static Map<String, Object> event(AuditLog.Line l, AuditLog.PageEntry p) {
        Map<String, Object> e = new LinkedHashMap<>();
        for (Map.Entry<String, Object> f : l.fields().entrySet()) {
            if (f.getKey().equals("pages") || f.getKey().equals("page") || f.getKey().equals("gen")) {
                if (!e.containsKey("page")) {
                    e.put("page", p.page());
                    e.put("gen", p.generation());
                    if (p.times() > 1) {
                        e.put("times", p.times());
                    }
                }
            } else {
                e.put(f.getKey(), f.getValue());
            }
        }
        return e;
    }

    private static int keygen(Options o, PrintStream out) throws IOException {
        Path dir = Path.of(o.require("--out"));
        String fingerprint = AuditKeys.generate(dir);
        out.println("wrote " + dir.resolve(AuditKeys.PRIVATE_FILE) + " (mode 600) and " + dir.resolve(AuditKeys.PUBLIC_FILE)
                + "; fingerprint " + fingerprint + " — pin the public key on verifiers");
        return OK;
    }

    private static long time(String value, long absent) {
        if (value == null) {
            return absent;
        }
        try {
            return Long.parseLong(value);
        } catch (NumberFormatException e) {
            try {
                return Instant.parse(value).toEpochMilli();
            } catch (DateTimeParseException e2) {
                throw new IllegalArgumentException("time must be an ISO-8601 instant or epoch milliseconds: '" + value + "'");
            }
        }
    }
}
