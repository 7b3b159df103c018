package dev.kvshield.audit;

import dev.kvshield.audit.internal.Json;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Path;
import java.time.Instant;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;

/**
 * The {@code ./kvshield audit} command: {@code verify}, {@code exposure}, {@code page},
 * {@code request}, {@code keygen}. The histories print one JSON object per page event (a record's
 * fields with its {@code pages} list replaced by the event's {@code page}, {@code gen} and, for an
 * event repeated in a row, {@code times}), so every event is reconstructed from the records; each is
 * of one trail (see {@code history}). Exit status 0 when all is well, 2 when a verification fails (or
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
              exposure [--pubkey FILE [--shipped FILE]] [--from T] [--to T] [--json] PATH...
                                                         requests that read another tenant's data or unwritten slots,
                                                         and the attempts that were blocked (T: ISO-8601 instant or epoch ms;
                                                         --from no later than --to); each trail read is verified as by
                                                         verify (--pubkey), and the answer says whether it was: exit 2
                                                         when a trail fails or (--shipped) a trail of a pool and rank
                                                         read is shipped but not given, NOT VERIFIED without --pubkey
              page PAGE [--trail ID] [--json] PATH...    the history of one page of one trail, one line per page event
              request ID|LABEL [--trail ID] [--json] PATH...
                                                         the history of one request of one trail, one line per event
                                                         (LABEL: the engine's name for it, e.g. SGLang's rid, as its summary
                                                         gives it); ids are per trail: one found in several trails is
                                                         refused, listing them, until --trail names one
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
        if (from > to) {
            throw new IllegalArgumentException("--from " + o.values().get("--from") + " is later than --to " + o.values().get("--to")
                    + ": the window would be empty");
        }
        List<AuditLog.Line> lines = AuditLog.read(o.requirePaths());
        if (lines.stream().noneMatch(AuditLog.Line::isRecord)) {
            throw new IOException("no audit records in " + o.paths());
        }
        String pubkey = o.values().get("--pubkey");
        List<Map<String, Object>> trails = verifyEach(lines, pubkey, o.values().get("--shipped"));
        boolean verified = pubkey != null && trails.stream().allMatch(t -> Boolean.TRUE.equals(t.get("ok")));
        ExposureQuery.Report r = ExposureQuery.run(lines, from, to);
        if (!verified) {
            err.println("kvshield audit: exposure answered from trails not verified"
                    + (pubkey == null ? " (no --pubkey given)" : ": " + Json.toJson(trails)));
        }
        if (o.json()) {
            Map<String, Object> doc = new LinkedHashMap<>();
            doc.put("verified", verified);
            doc.put("trails", trails);
            doc.putAll(r.toMap());
            out.println(Json.toJson(doc));
        } else {
            if (!verified) {
                out.println("NOT VERIFIED: " + (pubkey == null ? "no --pubkey given; the answer below is what the records say, unchecked"
                        : "the answer below stands on trails that failed verification:"));
                for (Map<String, Object> t : trails) {
                    if (!Boolean.TRUE.equals(t.get("ok"))) {
                        out.println("  trail " + t.get("trail") + ": first bad seq " + t.get("firstBadSeq") + " " + t.get("problems"));
                    }
                }
            }
            out.println("leaked: " + r.exposed().size() + " request(s) read another tenant's data or unwritten slots, or (a trail"
                    + " without reads) were handed another tenant's unscrubbed slots");
            for (ExposureQuery.Exposure e : r.exposed()) {
                out.println("  pool " + Json.toJson(e.pool()) + " rank " + e.rank() + " trail " + e.trail() + " " + e.who()
                        + (e.label() == null ? "" : " label " + Json.toJson(e.label()))
                        + " (" + e.outcome() + "): data of "
                        + (e.sourceTenants().isEmpty() ? "no other tenant" : Json.toJson(e.sourceTenants()))
                        + ", " + e.foreignSlotReads() + " foreign and " + e.unwrittenSlotReads() + " unwritten slot reads, "
                        + e.foreignSlotsReceived() + " foreign slots received, first at "
                        + Instant.ofEpochMilli(e.firstExposedWallMillis()));
            }
            out.println("stopped: " + r.blocked().size() + " attempt(s) rejected");
            for (ExposureQuery.Blocked b : r.blocked()) {
                out.println("  seq " + b.seq() + " " + Instant.ofEpochMilli(b.wallMillis()) + " " + b.type() + " " + b.who() + " page "
                        + b.page() + " gen " + b.generation());
            }
        }
        if (r.unparsedLines() > 0) {
            err.println("kvshield audit: " + r.unparsedLines() + " line(s) were not readable records; run 'audit verify'");
        }
        return pubkey != null && !verified ? BAD : OK;
    }

    /** A trail's files: those whose first record names {@code trail}, or one file {@code lone} without a record. */
    private record TrailFiles(String trail, Path lone) {}

    /**
     * Each trail the lines hold (its files: those whose first record names it; a file with none is a trail of its own),
     * verified as {@code verify --trail ID} would with {@code pubkey}, or, without one, reported not verified:
     * {@code {"trail", "ok", "firstBadSeq", "problems"}} per trail, in order of appearance.
     */
    private static List<Map<String, Object>> verifyEach(List<AuditLog.Line> lines, String pubkey, String shipped) throws IOException {
        Map<Path, String> trailOf = new LinkedHashMap<>();
        for (AuditLog.Line l : lines) {
            trailOf.putIfAbsent(l.file(), null);
            if (l.isRecord() && trailOf.get(l.file()) == null) {
                trailOf.put(l.file(), l.string("trail"));
            }
        }
        Map<TrailFiles, List<Path>> files = new LinkedHashMap<>();
        trailOf.forEach((f, t) -> files.computeIfAbsent(new TrailFiles(t, t == null ? f : null), k -> new ArrayList<>()).add(f));
        java.security.PublicKey key = pubkey == null ? null : AuditKeys.loadPublicKey(Path.of(pubkey));
        List<String> checkpoints = shipped == null ? List.of() : java.nio.file.Files.readAllLines(Path.of(shipped));
        List<Map<String, Object>> out = new ArrayList<>();
        for (Map.Entry<TrailFiles, List<Path>> g : files.entrySet()) {
            String trail = g.getKey().trail();
            String name = trail != null ? trail : g.getValue().getFirst().toString();
            if (key == null) {
                out.add(verdict(name, false, -1, List.of("not verified: no --pubkey given")));
            } else {
                AuditVerifier.Report v = AuditVerifier.verify(g.getValue(), key, checkpoints, trail);
                out.add(verdict(name, v.ok(), v.firstBadSeq(), v.problems()));
            }
        }
        if (key != null) {
            missingTrails(lines, trailOf.values(), checkpoints, out);
        }
        return out;
    }

    /**
     * A trail the shipped checkpoints name, of a pool and rank whose trails the paths hold, that no path holds (a boot's
     * files deleted, or left out of the query): a failed entry per trail, since the answer misses what it recorded.
     * Pools and ranks the paths hold nothing of are out of the query's scope and not judged.
     */
    private static void missingTrails(List<AuditLog.Line> lines, java.util.Collection<String> given, List<String> checkpoints,
            List<Map<String, Object>> out) {
        Set<List<Object>> scope = new java.util.HashSet<>();
        for (AuditLog.Line l : lines) {
            if (l.isRecord() && l.string("pool") != null) {
                scope.add(List.of(l.string("pool"), l.number("rank", -1)));
            }
        }
        Map<String, List<Object>> missing = new LinkedHashMap<>();
        for (String c : checkpoints) {
            Map<String, Object> f;
            try {
                f = Json.parseObject(c.strip());
            } catch (IllegalArgumentException e) {
                continue; // NOTE: the verification of each trail given reports a shipped line that is not a record
            }
            List<Object> poolRank = List.of(String.valueOf(f.get("pool")), f.get("rank") instanceof Long r ? r : -1L);
            if (f.get("trail") instanceof String trail && !given.contains(trail) && scope.contains(poolRank)) {
                missing.putIfAbsent(trail, poolRank);
            }
        }
        missing.forEach((trail, poolRank) -> out.add(verdict(trail, false, -1, List.of("the shipped checkpoints name trail "
                + trail + " of pool " + poolRank.get(0) + " rank " + poolRank.get(1) + ", which none of the paths given holds"
                + " (deleted, or left out of this query)"))));
    }

    /** One trail's verdict as {@code exposure} reports it: {@code {"trail", "ok", "firstBadSeq", "problems"}}. */
    private static Map<String, Object> verdict(String trail, boolean ok, long firstBadSeq, List<String> problems) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("trail", trail);
        m.put("ok", ok);
        m.put("firstBadSeq", firstBadSeq);
        m.put("problems", List.copyOf(problems));
        return m;
    }

    /**
     * {@code page PAGE} or {@code request ID|LABEL}: the events of one page or one request of one
     * trail. Page numbers, request ids and tenant ids are minted per pool and boot, so the same
     * number in two trails names two different pages or requests: a match in several trails is
     * refused, listing them, until {@code --trail} picks one.
     */
    private static int history(Options o, PrintStream out, String what) throws IOException {
        boolean byPage = what.equals("page");
        if (o.positional().isEmpty()) {
            throw new IllegalArgumentException(what + " needs a " + (byPage ? "PAGE" : "request ID or LABEL"));
        }
        String arg = o.positional().getFirst();
        long id = requestOrPage(arg);
        if (byPage && id < 0) {
            throw new IllegalArgumentException("page must be a number in [0, 2^62): '" + arg + "'");
        }
        List<AuditLog.Line> lines = records(o);
        // The trails (in order of appearance) holding the page or request, and the request ids it names in each.
        Map<String, Set<Long>> matches = new LinkedHashMap<>();
        for (AuditLog.Line l : lines) {
            long match = -1;
            if (byPage) {
                match = pagesOf(l).stream().anyMatch(p -> p.page() == id) ? id : -1;
            } else if (id >= 0 && ofRequest(l, id)) {
                match = id;
            } else if ("summary".equals(l.type()) && arg.equals(l.string("label"))) {
                match = l.number("req", -1);
            }
            if (match >= 0) {
                matches.computeIfAbsent(l.string("trail"), t -> new LinkedHashSet<>()).add(match);
            }
        }
        List<String> found = new ArrayList<>();
        matches.forEach((t, ids) -> ids.forEach(m -> found.add(byPage ? pageOf(lines, t, m) : describe(lines, t, m))));
        if (found.size() > 1) {
            throw new IllegalArgumentException(what + " " + Json.toJson(arg) + " names " + found.size() + " different " + what
                    + "s (their ids are minted per trail): " + String.join("; ", found) + "; name one "
                    + (matches.size() > 1 ? "trail with --trail TRAIL" : "request by its id"));
        }
        List<Map<String, Object>> events = new ArrayList<>();
        String trail = matches.isEmpty() ? null : matches.keySet().iterator().next();
        long match = matches.isEmpty() ? id : matches.get(trail).iterator().next();
        for (AuditLog.Line l : lines) {
            if (matches.isEmpty() || !Objects.equals(trail, l.string("trail")) || !byPage && !ofRequest(l, match)) {
                continue;
            }
            List<AuditLog.PageEntry> pages = pagesOf(l);
            if (pages.isEmpty() && !byPage) {
                events.add(l.fields());
            }
            for (AuditLog.PageEntry p : pages) {
                if (!byPage || p.page() == match) {
                    events.add(event(l, p));
                }
            }
        }
        if (o.json()) {
            out.println(Json.toJson(events));
        } else {
            if (!matches.isEmpty()) {
                out.println(byPage ? pageOf(lines, trail, match) : describe(lines, trail, match));
            }
            events.forEach(e -> out.println(Json.toJson(e)));
            out.println(events.size() + " record(s) for " + what + " " + (match >= 0 ? match : Json.toJson(arg)));
        }
        return OK;
    }

    /** The records of the paths, of the trail {@code --trail} names if given. */
    private static List<AuditLog.Line> records(Options o) throws IOException {
        String trail = o.values().get("--trail");
        List<AuditLog.Line> lines = new ArrayList<>();
        for (AuditLog.Line l : AuditLog.read(o.requirePaths())) {
            if (l.isRecord() && (trail == null || trail.equals(l.string("trail")))) {
                lines.add(l);
            }
        }
        if (lines.isEmpty()) {
            throw new IOException("no audit records" + (trail == null ? "" : " of trail " + trail) + " in " + o.paths());
        }
        return lines;
    }

    /** A page number or request id ({@code [0, 2^62)}), or -1 if {@code arg} is none (then it can only be a label). */
    private static long requestOrPage(String arg) {
        try {
            long v = Long.parseLong(arg);
            return v >= 0 && v < 1L << 62 ? v : -1;
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    private static boolean ofRequest(AuditLog.Line l, long id) {
        return l.number("req", -1) == id || l.number("reader", -1) == id || l.number("releasedByReq", -1) == id
                || l.number("fromReq", -1) == id;
    }

    private static List<AuditLog.PageEntry> pagesOf(AuditLog.Line l) throws IOException {
        try {
            return l.pages();
        } catch (IllegalArgumentException e) {
            throw new IOException(l.file().getFileName() + ":" + l.lineNumber() + ": " + e.getMessage() + "; run 'audit verify'");
        }
    }

    /** {@code (pool "P" rank R)} of a trail, from its first record. */
    private static String poolAndRank(List<AuditLog.Line> lines, String trail) {
        for (AuditLog.Line l : lines) {
            if (Objects.equals(trail, l.string("trail"))) {
                return "(pool " + Json.toJson(String.valueOf(l.string("pool"))) + " rank " + l.number("rank", -1) + ")";
            }
        }
        return "";
    }

    /** One page of one trail for people: its trail, pool and rank. */
    private static String pageOf(List<AuditLog.Line> lines, String trail, long page) {
        return "trail " + trail + " " + poolAndRank(lines, trail) + ": page " + page;
    }

    /** One request of one trail for people: its trail, pool and rank, tenant name and label (from its summary). */
    private static String describe(List<AuditLog.Line> lines, String trail, long request) {
        long tenant = -1;
        String label = null;
        for (AuditLog.Line l : lines) {
            if (Objects.equals(trail, l.string("trail")) && l.number("req", -1) == request) {
                tenant = tenant < 0 ? l.number("tenant", -1) : tenant;
                label = "summary".equals(l.type()) && label == null ? l.string("label") : label;
            }
        }
        String name = null;
        for (AuditLog.Line l : lines) {
            if (tenant >= 0 && "tenant".equals(l.type()) && Objects.equals(trail, l.string("trail")) && l.number("tenant", -1) == tenant) {
                name = l.string("name");
            }
        }
        return "trail " + trail + " " + poolAndRank(lines, trail) + ": request " + request
                + (tenant < 0 ? "" : " of tenant " + (name == null ? "#" + tenant : Json.toJson(name)))
                + (label == null ? "" : ", label " + Json.toJson(label));
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
