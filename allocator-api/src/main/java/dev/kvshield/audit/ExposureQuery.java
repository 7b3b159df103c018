package dev.kvshield.audit;

import dev.kvshield.audit.internal.ExposureTracker;
import dev.kvshield.audit.internal.Json;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Which requests received another tenant's data or unwritten slots, and which attempts were
 * stopped, from audit records alone: replays every page event each record lists
 * ({@link AuditLog.Line#pages()}), for each pool and rank, through the same tracker the live trail
 * uses. Event types are read by name, so a type added to {@link PageEventType} replays without
 * changes here. "Leaked" ({@link Report#exposed()}) and "stopped"
 * ({@link Report#blocked()}) are reported apart, so a notification can tell them apart.
 */
public final class ExposureQuery {
    private ExposureQuery() {}

    /**
     * A request that read foreign or unwritten data.
     *
     * @param trail the id of the trail that names it (request ids are minted per trail), or null if its open record has none
     * @param request the request that received it, or -1 (a namespace's hand-out, or the engine's unattributed holdings,
     *     {@link Owners#UNATTRIBUTED})
     * @param namespace the cache namespace that received it, or -1
     * @param label the engine's name for the request its summary gave (SGLang's {@code rid}), or null
     * @param outcome the outcome its summary gave, or {@code unfinished} without a summary
     * @param sourceTenants names of the tenants whose data reached it
     * @param foreignSlotsReceived in a trail without reads ({@code "reads":false} in its open record): slots of another
     *     tenant's unscrubbed data in the pages it was handed, each taken as read
     */
    public record Exposure(String pool, long rank, String trail, String tenant, long request, long namespace, String label,
            String outcome, List<String> sourceTenants,
            long foreignSlotReads, long unwrittenSlotReads, long foreignSlotsReceived, long firstExposedWallMillis) {
        /** Who received it, for people: as {@link Blocked#who()}. */
        public String who() {
            return Blocked.who(tenant, request, namespace);
        }
    }

    /**
     * A rejected access: an attempt the pool stopped.
     *
     * @param request the request that tried, or -1 (a namespace's attempt, or an unattributed one: nobody's, or
     *     an engine's free outside any request, {@link Owners#UNATTRIBUTED})
     * @param namespace the namespace (a prefix cache) that tried, or -1
     */
    public record Blocked(String pool, long rank, long seq, long wallMillis, String type, String tenant, long request,
            long namespace, long page, long generation) {
        /** Who tried, for people: {@code [tenant T] request R}, {@code [tenant T] namespace N}, or {@code [tenant T] unattributed}. */
        public String who() {
            return who(tenant, request, namespace);
        }

        static String who(String tenant, long request, long namespace) {
            return (tenant.isEmpty() ? "" : "tenant " + tenant + " ")
                    + (namespace >= 0 ? "namespace " + namespace : request >= 0 ? "request " + request : "unattributed");
        }
    }

    public record Report(List<Exposure> exposed, List<Blocked> blocked, int unparsedLines) {
        /** One JSON document: {@code {"exposed":[...],"blocked":[...],"unparsedLines":N}}. */
        public String toJson() {
            return Json.toJson(toMap());
        }

        /** The fields of {@link #toJson()}, in order, for a caller that adds its own. */
        public Map<String, Object> toMap() {
            List<Object> e = new ArrayList<>();
            for (Exposure x : exposed) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("pool", x.pool());
                m.put("rank", x.rank());
                m.put("trail", x.trail());
                m.put("tenant", x.tenant());
                m.put("request", x.request());
                m.put("namespace", x.namespace());
                m.put("label", x.label());
                m.put("outcome", x.outcome());
                m.put("sourceTenants", x.sourceTenants());
                m.put("foreignSlotReads", x.foreignSlotReads());
                m.put("unwrittenSlotReads", x.unwrittenSlotReads());
                m.put("foreignSlotsReceived", x.foreignSlotsReceived());
                m.put("firstExposedWallMillis", x.firstExposedWallMillis());
                e.add(m);
            }
            List<Object> b = new ArrayList<>();
            for (Blocked x : blocked) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("pool", x.pool());
                m.put("rank", x.rank());
                m.put("seq", x.seq());
                m.put("wallMillis", x.wallMillis());
                m.put("type", x.type());
                m.put("tenant", x.tenant());
                m.put("request", x.request());
                m.put("namespace", x.namespace());
                m.put("page", x.page());
                m.put("generation", x.generation());
                b.add(m);
            }
            Map<String, Object> doc = new LinkedHashMap<>();
            doc.put("exposed", e);
            doc.put("blocked", b);
            doc.put("unparsedLines", (long) unparsedLines);
            return doc;
        }
    }

    /** A trail's pool and rank (a pool id may hold any character, so never joined into one string). */
    private record PoolRank(String pool, long rank) {}

    /** Per boot of a pool and rank: the tracker, tenant names, and the window's exposed reads per request. */
    private static final class Scope {
        final PoolRank poolRank;
        final String trail;
        final ExposureTracker tracker;
        final Map<Long, String> tenantNames = new HashMap<>();
        final Map<ExposureTracker.Key, Long> firstExposedInWindow = new HashMap<>();

        Scope(PoolRank poolRank, String trail, int pages, int slots, boolean readsRecorded) {
            this.poolRank = poolRank;
            this.trail = trail;
            tracker = new ExposureTracker(pages, slots, readsRecorded);
        }

        String name(long tenant) {
            return tenant < 0 ? "" : tenantNames.getOrDefault(tenant, "tenant#" + tenant);
        }
    }

    /**
     * Runs the query over records whose wall time is in {@code [fromMillis, toMillis]} (exposed
     * reads and rejections; all events are replayed to know whose data each slot holds). A request's
     * counts and source tenants are what reached it inside the window.
     */
    public static Report run(List<AuditLog.Line> lines, long fromMillis, long toMillis) {
        Map<PoolRank, Scope> scopes = new HashMap<>();
        List<Exposure> exposed = new ArrayList<>();
        List<Blocked> blocked = new ArrayList<>();
        int unparsed = 0;
        for (AuditLog.Line line : lines) {
            if (!line.isRecord()) {
                unparsed++;
                continue;
            }
            String pool = String.valueOf(line.string("pool"));
            long rank = line.number("rank", -1);
            PoolRank scopeKey = new PoolRank(pool, rank);
            String type = line.type();
            if ("open".equals(type)) { // NOTE: a new boot of the pool and rank: the last one's open requests ended unfinished
                long pages = line.number("pageCount", -1);
                long slots = line.number("slotsPerPage", -1);
                if (!isGeometry(pages, slots)) {
                    unparsed++;
                    continue;
                }
                // NOTE: a trail without the field (older ones) was written by pools that record every read
                boolean reads = !(line.fields().get("reads") instanceof Boolean b) || b;
                Scope ended = scopes.put(scopeKey, new Scope(scopeKey, line.string("trail"), (int) pages, (int) slots, reads));
                if (ended != null) {
                    reportUnfinished(ended, exposed);
                }
                continue;
            }
            Scope scope = scopes.get(scopeKey);
            if (scope == null) {
                unparsed++;
                continue;
            }
            long wall = line.number("wall", 0);
            boolean inWindow = wall >= fromMillis && wall <= toMillis;
            long tenant = line.number("tenant", -1);
            long owner = ownerOf(line);
            switch (type) {
                case "tenant" -> scope.tenantNames.put(tenant, line.string("name"));
                case "summary" -> {
                    ExposureTracker.RequestState r = scope.tracker.finish((int) tenant, owner);
                    Long first = r == null ? null : scope.firstExposedInWindow.remove(r.key);
                    if (first != null) {
                        exposed.add(exposure(scope, r, line.string("label"), line.string("outcome"), first));
                    }
                }
                case "checkpoint" -> { }
                default -> {
                    PageEventType event = eventType(type);
                    List<AuditLog.PageEntry> pages;
                    try {
                        pages = event == null ? null : line.pages();
                    } catch (IllegalArgumentException e) {
                        pages = null;
                    }
                    if (pages == null) {
                        unparsed++;
                        continue;
                    }
                    long detail = detail(line, event);
                    scope.tracker.counting(inWindow);
                    for (AuditLog.PageEntry p : pages) {
                        boolean flagged = scope.tracker.apply(event.ordinal(), (int) p.page(), (int) p.generation(), (int) tenant, owner,
                                detail, (int) p.times());
                        if (event.isReceipt() && flagged && inWindow) {
                            scope.firstExposedInWindow.putIfAbsent(new ExposureTracker.Key((int) tenant, owner), wall);
                        }
                        if (event.isRejection() && inWindow) {
                            for (long k = 0; k < p.times(); k++) {
                                blocked.add(new Blocked(pool, rank, line.number("seq", -1), wall, type, scope.name(tenant),
                                        requestOf(owner), namespaceOf(owner), p.page(), p.generation()));
                            }
                        }
                    }
                }
            }
        }
        for (Scope scope : scopes.values()) {
            reportUnfinished(scope, exposed);
        }
        return new Report(List.copyOf(exposed), List.copyOf(blocked), unparsed);
    }

    /** Whether an opening record's {@code pageCount} and {@code slotsPerPage} are a pool's (a tracker can hold them). */
    private static boolean isGeometry(long pageCount, long slotsPerPage) {
        return pageCount >= 0 && pageCount <= Integer.MAX_VALUE && slotsPerPage >= 1 && slotsPerPage <= PoolGeometry.MAX_PAGE_SIZE_TOKENS
                && pageCount * slotsPerPage <= Integer.MAX_VALUE - 8;
    }

    /** The exposed requests of a boot that never wrote their summary (still running, or the process ended). */
    private static void reportUnfinished(Scope scope, List<Exposure> exposed) {
        for (ExposureTracker.RequestState r : scope.tracker.unfinished()) {
            Long first = scope.firstExposedInWindow.get(r.key);
            if (first != null) {
                exposed.add(exposure(scope, r, null, "unfinished", first));
            }
        }
    }

    private static Exposure exposure(Scope scope, ExposureTracker.RequestState r, String label, String outcome, long first) {
        List<String> sources = new ArrayList<>();
        for (int t : r.sourceTenants) {
            sources.add(scope.name(t));
        }
        long owner = r.key.owner();
        return new Exposure(scope.poolRank.pool(), scope.poolRank.rank(), scope.trail, scope.name(r.key.tenant()), requestOf(owner),
                namespaceOf(owner), label, outcome, List.copyOf(sources),
                r.foreignSlotReads, r.unwrittenSlotReads, r.foreignSlotsReceived, first);
    }

    /** The request an owner is, or -1 (nobody, a namespace, or the engine's unattributed holdings). */
    private static long requestOf(long owner) {
        return Owners.isValid(owner) && !Owners.isNamespace(owner) && owner != Owners.UNATTRIBUTED ? Owners.id(owner) : -1;
    }

    /** The namespace an owner is, or -1. */
    private static long namespaceOf(long owner) {
        return Owners.isNamespace(owner) ? Owners.id(owner) : -1;
    }

    private static PageEventType eventType(String type) {
        try {
            return PageEventType.valueOf(type.toUpperCase(Locale.ROOT));
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    /** A level's ordinal from its name, or from the number the trail writes for an ordinal it has no name for; -1 if neither. */
    private static long levelOrdinal(String level) {
        if (level == null) {
            return -1;
        }
        for (ProtectionLevel l : ProtectionLevel.values()) {
            if (l.name().equalsIgnoreCase(level)) {
                return l.ordinal();
            }
        }
        try {
            return Long.parseLong(level);
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    /** The owner a record names ({@code req} or {@code ns}); {@link Owners#NOBODY} if none, or an id no owner can have. */
    private static long ownerOf(AuditLog.Line line) {
        long req = line.number("req", -1);
        if (isId(req)) {
            return Owners.request(req);
        }
        long ns = line.number("ns", -1);
        return isId(ns) ? Owners.namespace(ns) : Owners.NOBODY;
    }

    /** The reader a grant names: a request ({@code reader}) or a namespace ({@code readerNs}); {@link Owners#NOBODY} if neither. */
    private static long readerOf(AuditLog.Line line) {
        long ns = line.number("readerNs", -1);
        long req = line.number("reader", -1);
        return isId(ns) ? Owners.namespace(ns) : isId(req) ? Owners.request(req) : Owners.NOBODY;
    }

    /** Whether a record's id field can name an owner ({@code [0, 2^62)}): a replayed record is untrusted. */
    private static boolean isId(long id) {
        return id >= 0 && id < 1L << 62;
    }

    /** Rebuilds the event's {@code detail} argument from the fields the trail wrote. */
    private static long detail(AuditLog.Line line, PageEventType event) {
        return switch (event) {
            case READ, WRITE -> line.fields().get("slots") instanceof List<?> l && l.size() == 2
                    && l.get(0) instanceof Long a && l.get(1) instanceof Long b ? (a << 32) | b : 0;
            case PROTECT_ISSUED, PROTECT_DONE, PROTECT_FAILED, VERIFY_FAILED -> levelOrdinal(line.string("level"));
            case SEAL, RECLAIM, SHRED -> line.number("keyEpoch", 0);
            case READER_ADDED, READER_REMOVED -> readerOf(line);
            default -> line.number("detail", 0);
        };
    }
}
