package dev.kvshield.perf.fuzz;

import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * One fuzz trace: the pool it runs on, its requests, and the exact schedule of actor actions the
 * scheduler replays. Immutable; replaying a trace is deterministic.
 *
 * <p>File format (UTF-8 text, one item per line, {@code #} starts a comment line):
 *
 * <pre>
 * kvshield-fuzz-trace 1
 * config level=ZERO mode=SYNCHRONOUS lag=0 pages=6 tenants=2 [serials=N] [generations=N] [claims=N]
 * request ID tenant=T kind=local|handoff tokens=N prefix=P drop=D
 * event adv ID | cancel ID | ack ID | expire ID | evict TENANT | step | protect
 * event misuse ID V | unmatch ID | churn ID N | race TENANT V | reclaim TENANT V | fault K
 * </pre>
 *
 * {@code pages} counts page 0, which is reserved. {@code serials} starts the pool's lease counter
 * that many ids before its end ({@link dev.kvshield.lease.LeaseIds#maxSerial()}), {@code generations}
 * its pages that many generations before the last; absent, both start at 1. {@code claims} caps the
 * claims live or fenced at once ({@code PoolConfig.maxClaims}); absent, the pool's default. {@code prefix} is a shared prefix of the
 * request's tenant ({@code -1}: none; local requests only). {@code drop} is the reserved page
 * index a handoff's transport loses while still publishing full coverage ({@code -1}: none).
 * Events: {@code adv} advances a request's actor one step (allocate, write a page, begin a
 * transfer, land one transferred page, commit, read back, finish); {@code cancel} aborts it;
 * {@code ack} delivers its transfer's "done" signal; {@code expire} fires its claim timer;
 * {@code evict} drops the tenant's oldest cached prefix; {@code step} is a scheduler step
 * boundary; {@code protect} advances the protection worker of backends that complete later.
 * The lease events: {@code misuse} has the request present a hostile batch ({@link Misuse} decodes
 * {@code V}: which call, which flaw, where in the batch); {@code unmatch} ends its read of its prefix
 * (again, or before it matched: a release of a reader lease it does not hold); {@code churn} takes,
 * fences and drops writer claims on its pages {@code N} times (the key epoch moves after every seal:
 * {@link RacingSealer}); {@code race} arms an operator who retires ({@code V} = 0) or breaks ({@code V} = 1) the
 * tenant's other key epochs right after its next unseal; {@code reclaim} reclaims every sealed
 * prefix of the tenant in one call ({@code V mod 3} = 1: each reference twice, 2: with another
 * tenant's reference; {@code V / 3} odd: a race armed just before it, retiring when {@code V / 6}
 * is even, breaking when odd); {@code fault} makes the backend's next scrub or seal fail after
 * {@code K} pages of its batch.
 */
public record FuzzTrace(Config config, List<RequestSpec> requests, List<Event> events) {
    static final String MAGIC = "kvshield-fuzz-trace 1";
    /** Tokens per page and bytes per token of every fuzz pool (one layer, K and V, one canary cell per token). */
    public static final int PAGE_TOKENS = 4;

    public FuzzTrace {
        requests = List.copyOf(requests);
        events = List.copyOf(events);
        Set<Integer> ids = new HashSet<>();
        for (RequestSpec r : requests) {
            if (!ids.add(r.id())) {
                throw new IllegalArgumentException("request id " + r.id() + " appears twice");
            }
            if (r.tenant() >= config.tenants()) {
                throw new IllegalArgumentException("request " + r.id() + ": tenant " + r.tenant() + " is not below tenants="
                        + config.tenants());
            }
        }
        for (Event e : events) {
            if (e.action().targetsRequest() && !ids.contains(e.target())) {
                throw new IllegalArgumentException("event " + e + " names no request of the trace");
            }
            if (e.action().targetsTenant() && (e.target() < 0 || e.target() >= config.tenants())) {
                throw new IllegalArgumentException("event " + e + ": tenant must be in [0, " + config.tenants() + ")");
            }
        }
    }

    /**
     * The pool a trace runs on.
     *
     * @param serials lease ids left before the counter's end, or -1 (the counter starts at 1)
     * @param generations generations left before the last, or -1 (pages start at generation 1)
     * @param claims the most claims live or fenced at once, or -1 (the pool's default)
     */
    public record Config(ProtectionLevel level, QuarantineMode mode, int lagSteps, int pages, int tenants, int serials,
            int generations, int claims) {
        public static final int MAX_SERIALS = 100_000;
        public static final int MAX_GENERATIONS = 1_000;
        public static final int MAX_CLAIMS = 64;

        public Config(ProtectionLevel level, QuarantineMode mode, int lagSteps, int pages, int tenants) {
            this(level, mode, lagSteps, pages, tenants, -1, -1, -1);
        }

        public Config {
            if (level == null || mode == null) {
                throw new IllegalArgumentException("level and mode must be given");
            }
            if (lagSteps < 0 || lagSteps > 4) {
                throw new IllegalArgumentException("lag must be in [0, 4]: " + lagSteps);
            }
            if (pages < 2 || pages > 4096) {
                throw new IllegalArgumentException("pages must be in [2, 4096] (page 0 is reserved): " + pages);
            }
            if (tenants < 1 || tenants > 64) {
                throw new IllegalArgumentException("tenants must be in [1, 64]: " + tenants);
            }
            if (serials != -1 && (serials < 1 || serials > MAX_SERIALS)) {
                throw new IllegalArgumentException("serials must be -1 or in [1, " + MAX_SERIALS + "]: " + serials);
            }
            if (generations != -1 && (generations < 1 || generations > MAX_GENERATIONS)) {
                throw new IllegalArgumentException("generations must be -1 or in [1, " + MAX_GENERATIONS + "]: " + generations);
            }
            if (claims != -1 && (claims < 1 || claims > MAX_CLAIMS)) {
                throw new IllegalArgumentException("claims must be -1 or in [1, " + MAX_CLAIMS + "]: " + claims);
            }
        }
    }

    public enum Kind {
        LOCAL,
        HANDOFF
    }

    /** One request: a local prefill-and-decode, or a prefill→decode handoff. */
    public record RequestSpec(int id, int tenant, Kind kind, int tokens, int prefix, int dropPage) {
        public static final int MAX_TOKENS = 64;

        public RequestSpec {
            if (id < 1 || id >= 1_000_000) {
                throw new IllegalArgumentException("request id must be in [1, 1000000): " + id);
            }
            if (tenant < 0 || kind == null) {
                throw new IllegalArgumentException("request " + id + ": tenant must be >= 0 and kind given");
            }
            if (tokens < 1 || tokens > MAX_TOKENS) {
                throw new IllegalArgumentException("request " + id + ": tokens must be in [1, " + MAX_TOKENS + "]: " + tokens);
            }
            if (prefix < -1 || prefix > 7 || (prefix >= 0 && kind != Kind.LOCAL)) {
                throw new IllegalArgumentException("request " + id + ": prefix must be -1 or in [0, 7], local requests only: " + prefix);
            }
            if (dropPage < -1 || dropPage >= pages(tokens) || (dropPage >= 0 && kind != Kind.HANDOFF)) {
                throw new IllegalArgumentException("request " + id + ": drop must be -1 or a page index below " + pages(tokens)
                        + ", handoffs only: " + dropPage);
            }
        }

        public int pages() {
            return pages(tokens);
        }

        static int pages(int tokens) {
            return (tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
        }
    }

    public enum Action {
        ADV(Target.REQUEST, false),
        CANCEL(Target.REQUEST, false),
        ACK(Target.REQUEST, false),
        EXPIRE(Target.REQUEST, false),
        EVICT(Target.TENANT, false),
        STEP(Target.NONE, false),
        PROTECT(Target.NONE, false),
        MISUSE(Target.REQUEST, true),
        UNMATCH(Target.REQUEST, false),
        CHURN(Target.REQUEST, true),
        RACE(Target.TENANT, true),
        RECLAIM(Target.TENANT, true),
        FAULT(Target.NONE, true);

        private enum Target {
            REQUEST,
            TENANT,
            NONE
        }

        /** Largest argument of an action that takes one. */
        public static final int MAX_ARG = 1 << 20;

        private final Target target;
        private final boolean arg;

        Action(Target target, boolean arg) {
            this.target = target;
            this.arg = arg;
        }

        boolean targetsRequest() {
            return target == Target.REQUEST;
        }

        boolean targetsTenant() {
            return target == Target.TENANT;
        }

        boolean hasTarget() {
            return target != Target.NONE;
        }

        boolean hasArg() {
            return arg;
        }
    }

    /** One scheduled action; {@code target} is a request id, a tenant or -1; {@code arg} the action's argument or -1. */
    public record Event(Action action, int target, int arg) {
        public Event {
            if (action.hasArg() != (arg >= 0) || arg > Action.MAX_ARG) {
                throw new IllegalArgumentException("event " + action + (action.hasArg() ? " takes an argument in [0, "
                        + Action.MAX_ARG + "]" : " takes no argument") + ": " + arg);
            }
        }

        public Event(Action action, int target) {
            this(action, target, -1);
        }

        @Override
        public String toString() {
            return action.name().toLowerCase(Locale.ROOT) + (action.hasTarget() ? " " + target : "") + (action.hasArg() ? " " + arg : "");
        }
    }

    /** Requests and events of this trace, keeping only requests {@code keep} accepts (and their events). */
    public FuzzTrace onlyRequests(java.util.function.IntPredicate keep) {
        List<RequestSpec> rs = requests.stream().filter(r -> keep.test(r.id())).toList();
        List<Event> es = events.stream().filter(e -> !e.action().targetsRequest() || keep.test(e.target())).toList();
        return new FuzzTrace(config, rs, es);
    }

    public FuzzTrace withEvents(List<Event> newEvents) {
        return new FuzzTrace(config, requests, newEvents);
    }

    /** The trace in the file format above. */
    public String format() {
        StringBuilder s = new StringBuilder(MAGIC).append('\n');
        s.append("config level=").append(config.level()).append(" mode=").append(config.mode()).append(" lag=")
                .append(config.lagSteps()).append(" pages=").append(config.pages()).append(" tenants=").append(config.tenants());
        if (config.serials() != -1) {
            s.append(" serials=").append(config.serials());
        }
        if (config.generations() != -1) {
            s.append(" generations=").append(config.generations());
        }
        if (config.claims() != -1) {
            s.append(" claims=").append(config.claims());
        }
        s.append('\n');
        for (RequestSpec r : requests) {
            s.append("request ").append(r.id()).append(" tenant=").append(r.tenant()).append(" kind=")
                    .append(r.kind().name().toLowerCase(Locale.ROOT)).append(" tokens=").append(r.tokens()).append(" prefix=")
                    .append(r.prefix()).append(" drop=").append(r.dropPage()).append('\n');
        }
        for (Event e : events) {
            s.append("event ").append(e).append('\n');
        }
        return s.toString();
    }

    public void write(Path file) throws IOException {
        Files.writeString(file, format());
    }

    public static FuzzTrace read(Path file) throws IOException {
        return parse(Files.readString(file));
    }

    /**
     * Parses the file format.
     *
     * @throws IllegalArgumentException naming the line and what is wrong with it
     */
    public static FuzzTrace parse(String text) {
        String[] lines = text.split("\\R", -1);
        Config config = null;
        List<RequestSpec> requests = new ArrayList<>();
        List<Event> events = new ArrayList<>();
        boolean magic = false;
        for (int n = 0; n < lines.length; n++) {
            String line = lines[n].strip();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            try {
                if (!magic) {
                    if (!line.equals(MAGIC)) {
                        throw new IllegalArgumentException("expected '" + MAGIC + "', found '" + clip(line) + "'");
                    }
                    magic = true;
                    continue;
                }
                String[] w = line.split("\\s+");
                switch (w[0]) {
                    case "config" -> {
                        if (config != null) {
                            throw new IllegalArgumentException("a second config line");
                        }
                        Map<String, String> kv = pairs(w, 1, Set.of("level", "mode", "lag", "pages", "tenants"),
                                Set.of("serials", "generations", "claims"));
                        config = new Config(enumOf(ProtectionLevel.class, kv.get("level"), "level"),
                                enumOf(QuarantineMode.class, kv.get("mode"), "mode"), integer(kv, "lag"), integer(kv, "pages"),
                                integer(kv, "tenants"), kv.containsKey("serials") ? integer(kv, "serials") : -1,
                                kv.containsKey("generations") ? integer(kv, "generations") : -1,
                                kv.containsKey("claims") ? integer(kv, "claims") : -1);
                    }
                    case "request" -> {
                        if (w.length < 2) {
                            throw new IllegalArgumentException("request needs an id");
                        }
                        Map<String, String> kv = pairs(w, 2, Set.of("tenant", "kind", "tokens", "prefix", "drop"), Set.of());
                        requests.add(new RequestSpec(number(w[1], "request id"), integer(kv, "tenant"),
                                enumOf(Kind.class, kv.get("kind"), "kind"), integer(kv, "tokens"), integer(kv, "prefix"),
                                integer(kv, "drop")));
                    }
                    case "event" -> {
                        if (w.length < 2) {
                            throw new IllegalArgumentException("event needs an action");
                        }
                        Action a = enumOf(Action.class, w[1], "event action");
                        int expected = 2 + (a.hasTarget() ? 1 : 0) + (a.hasArg() ? 1 : 0);
                        if (w.length != expected) {
                            throw new IllegalArgumentException("event " + w[1] + " takes " + (expected - 2) + " argument(s)");
                        }
                        int target = a.hasTarget() ? number(w[2], "event target") : -1;
                        events.add(new Event(a, target, a.hasArg() ? number(w[expected - 1], "event argument") : -1));
                    }
                    default -> throw new IllegalArgumentException("unknown line kind '" + clip(w[0])
                            + "'; allowed: config, request, event");
                }
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("trace line " + (n + 1) + ": " + e.getMessage(), e);
            }
        }
        if (!magic || config == null) {
            throw new IllegalArgumentException("not a fuzz trace: it needs the line '" + MAGIC + "' and a config line");
        }
        return new FuzzTrace(config, requests, events);
    }

    private static String clip(String s) {
        return s.length() > 40 ? s.substring(0, 40) + "..." : s;
    }

    private static Map<String, String> pairs(String[] w, int from, Set<String> names, Set<String> optional) {
        Map<String, String> kv = new HashMap<>();
        for (int i = from; i < w.length; i++) {
            int eq = w[i].indexOf('=');
            String name = eq < 0 ? w[i] : w[i].substring(0, eq);
            if (eq < 0 || !(names.contains(name) || optional.contains(name)) || kv.containsKey(name)) {
                throw new IllegalArgumentException("unknown or repeated field '" + clip(w[i]) + "'; allowed: " + String.join("=, ",
                        java.util.stream.Stream.concat(names.stream(), optional.stream()).sorted().toList()) + "=");
            }
            kv.put(name, w[i].substring(eq + 1));
        }
        for (String name : names) {
            if (!kv.containsKey(name)) {
                throw new IllegalArgumentException("missing field " + name + "=");
            }
        }
        return kv;
    }

    private static int integer(Map<String, String> kv, String name) {
        return number(kv.get(name), name);
    }

    private static int number(String s, String what) {
        try {
            return Integer.parseInt(s);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(what + " must be an integer: '" + clip(s) + "'");
        }
    }

    private static <E extends Enum<E>> E enumOf(Class<E> type, String s, String what) {
        for (E e : type.getEnumConstants()) {
            if (e.name().equalsIgnoreCase(s)) {
                return e;
            }
        }
        throw new IllegalArgumentException(what + " '" + clip(s) + "' is not one of " + java.util.Arrays.toString(type.getEnumConstants())
                .toLowerCase(Locale.ROOT));
    }
}
