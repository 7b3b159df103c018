package dev.kvshield.bridge;

import dev.kvshield.audit.CheckpointShipper;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The operator's settings of one bridge, parsed and validated once from string properties (what
 * Python passes across). Immutable.
 *
 * <table>
 *   <caption>properties and defaults</caption>
 *   <tr><th>property</th><th>default</th><th>meaning</th></tr>
 *   <tr><td>{@value #LEVEL}</td><td>ZERO</td><td>NONE, ZERO, ENCRYPT or COMPLIANCE</td></tr>
 *   <tr><td>{@value #STRICT}</td><td>false</td><td>true: a rejected free raises; false: it is counted, audited and dropped</td></tr>
 *   <tr><td>{@value #QUARANTINE}</td><td>SYNCHRONOUS</td><td>SYNCHRONOUS or ASYNCHRONOUS protection</td></tr>
 *   <tr><td>{@value #RELEASE_LAG_STEPS}</td><td>0</td><td>steps protection may take before a step boundary waits for it</td></tr>
 *   <tr><td>{@value #RANK}</td><td>0</td><td>tensor-parallel rank (metrics, key derivation)</td></tr>
 *   <tr><td>{@value #POOL_ID}</td><td>sglang</td><td>pool identity</td></tr>
 *   <tr><td>{@value #DEFAULT_TENANT}</td><td>default</td><td>tenant of requests with no trusted tenant</td></tr>
 *   <tr><td>{@value #BACKEND}</td><td>cpu-external</td><td>page-memory backend name (cpu-external, cpu-offheap, cuda, ...)</td></tr>
 *   <tr><td>{@value #SEALER_FACTORY}</td><td>(none)</td><td>class name of a {@link PageSealerFactory} with a public no-argument constructor (ENCRYPT)</td></tr>
 *   <tr><td>{@value #ROOT_KEY}</td><td>(none)</td><td>ENCRYPT's root key: {@code file:PATH} (32 bytes, owner-only), {@code fd:N} (inherited descriptor) or {@code ephemeral} (development); the backend's own sealer is used (GPU sealer on {@code cuda})</td></tr>
 *   <tr><td>{@value #ADVERTISED_CONTEXT_TOKENS}</td><td>(pool bound)</td><td>the engine's context length</td></tr>
 *   <tr><td>{@value #HEADROOM_FRACTION}</td><td>0</td><td>share of the pool kept free beside one max-length request</td></tr>
 *   <tr><td>{@value #STRICT_ADMISSION}</td><td>false</td><td>refuse to start when the pool cannot hold one advertised max-length request</td></tr>
 *   <tr><td>{@value #METRICS_BASE_PORT}</td><td>0 (off)</td><td>serve the pool's metrics in Prometheus text format on loopback port {@code metricsBasePort + rank}</td></tr>
 *   <tr><td>{@value #AUDIT_SIGNING_KEY}</td><td>(none)</td><td>the audit trail's Ed25519 signing key file ({@code audit keygen}; owner-only)</td></tr>
 *   <tr><td>{@value #AUDIT_DIR}</td><td>(none)</td><td>directory of the pool's signed audit trail ({@code audit-<poolId>-r<rank>*} files)</td></tr>
 *   <tr><td>{@value #AUDIT_SHIP}</td><td>log</td><td>where each signed checkpoint is shipped off the host, comma-separated: {@code log} (a log
 *       line on logger {@code dev.kvshield.audit.checkpoints}, for the engine's log collector), {@code file:PATH} (appended to a file
 *       another machine collects)</td></tr>
 *   <tr><td>{@value #AUDIT_CHECKPOINT_SECONDS}</td><td>10</td><td>a signed checkpoint at the first step boundary this long after the
 *       last one (besides every 10,000 records and at close): SGLang's shutdown kills its schedulers, so a trail's tail stays
 *       unsigned since its last checkpoint; 0 turns the timed ones off</td></tr>
 * </table>
 *
 * <p>The audit settings come as a pair: with both, the pool's audit trail is attached; under {@code COMPLIANCE}
 * both are required (parsing fails naming the missing one), so a compliance pool never runs without its trail. A trail
 * always ships its checkpoints somewhere off the host ({@value #AUDIT_SHIP}): the signing key sits on the serving host, so
 * only a copy the host no longer controls catches a rewritten trail ({@code audit verify --shipped}).
 */
public final class BridgeSettings {
    public static final String LEVEL = "level";
    public static final String STRICT = "strict";
    public static final String QUARANTINE = "quarantine";
    public static final String RELEASE_LAG_STEPS = "releaseLagSteps";
    public static final String RANK = "rank";
    public static final String POOL_ID = "poolId";
    public static final String DEFAULT_TENANT = "defaultTenant";
    public static final String BACKEND = "backend";
    public static final String SEALER_FACTORY = "sealerFactory";
    public static final String ROOT_KEY = "rootKey";
    public static final String ADVERTISED_CONTEXT_TOKENS = "advertisedContextTokens";
    public static final String HEADROOM_FRACTION = "headroomFraction";
    public static final String STRICT_ADMISSION = "strictAdmission";
    public static final String METRICS_BASE_PORT = "metricsBasePort";
    public static final String AUDIT_SIGNING_KEY = "auditSigningKey";
    public static final String AUDIT_DIR = "auditDir";
    public static final String AUDIT_SHIP = "auditShip";
    public static final String AUDIT_CHECKPOINT_SECONDS = "auditCheckpointSeconds";
    private static final List<String> KEYS = List.of(LEVEL, STRICT, QUARANTINE, RELEASE_LAG_STEPS, RANK,
            POOL_ID, DEFAULT_TENANT, BACKEND, SEALER_FACTORY, ROOT_KEY, ADVERTISED_CONTEXT_TOKENS, HEADROOM_FRACTION, STRICT_ADMISSION,
            METRICS_BASE_PORT, AUDIT_SIGNING_KEY, AUDIT_DIR, AUDIT_SHIP,
            AUDIT_CHECKPOINT_SECONDS);

    final ProtectionLevel level;
    final boolean strict;
    final QuarantineMode quarantine;
    final int releaseLagSteps;
    final int rank;
    final String poolId;
    final String defaultTenant;
    final String backend;
    final PageSealerFactory sealerFactory;
    final RootKeySource rootKey;
    final long advertisedContextTokens;
    final BigDecimal headroomFraction;
    final boolean strictAdmission;
    final int metricsBasePort;
    /** The audit trail's signing key file and directory: both set, or both null. */
    final Path auditSigningKey;
    final Path auditDir;
    /** Where the trail's checkpoints are shipped: never empty. */
    final List<CheckpointShipper> auditShippers;
    final long auditCheckpointSeconds;

    private BridgeSettings(Map<String, String> p) {
        level = parseEnum(p, LEVEL, ProtectionLevel.class, ProtectionLevel.ZERO);
        strict = parseBoolean(p, STRICT);
        quarantine = parseEnum(p, QUARANTINE, QuarantineMode.class, QuarantineMode.SYNCHRONOUS);
        releaseLagSteps = (int) parseLong(p, RELEASE_LAG_STEPS, 0, 0, 1024);
        rank = (int) parseLong(p, RANK, 0, 0, Integer.MAX_VALUE);
        poolId = p.getOrDefault(POOL_ID, "sglang");
        defaultTenant = p.getOrDefault(DEFAULT_TENANT, "default");
        backend = p.getOrDefault(BACKEND, "cpu-external");
        sealerFactory = p.containsKey(SEALER_FACTORY) ? loadSealer(p.get(SEALER_FACTORY)) : null;
        rootKey = p.containsKey(ROOT_KEY) ? parseRootKey(p.get(ROOT_KEY)) : null;
        if (sealerFactory != null && rootKey != null) {
            throw new IllegalArgumentException(SEALER_FACTORY + " and " + ROOT_KEY + " are both set; give one: the factory"
                    + " brings its own keys");
        }
        advertisedContextTokens = parseLong(p, ADVERTISED_CONTEXT_TOKENS, Long.MAX_VALUE, 1, Long.MAX_VALUE);
        String headroom = p.getOrDefault(HEADROOM_FRACTION, "0");
        String decimal = unpadded(headroom);
        if (!decimal.matches("[0-9]+(\\.[0-9]+)?")) {
            throw new IllegalArgumentException(HEADROOM_FRACTION + " must be a number in [0, 1): " + shown(headroom));
        }
        // Parsed as a decimal: the admission arithmetic is exact (see AdmissionPolicy).
        headroomFraction = new BigDecimal(decimal);
        strictAdmission = parseBoolean(p, STRICT_ADMISSION);
        metricsBasePort = (int) parseLong(p, METRICS_BASE_PORT, 0, 0, 65535);
        if (metricsBasePort > 0 && (long) metricsBasePort + rank > 65535) {
            throw new IllegalArgumentException(METRICS_BASE_PORT + " + " + RANK + " must be a port <= 65535: " + metricsBasePort + " + "
                    + rank);
        }
        auditSigningKey = path(p, AUDIT_SIGNING_KEY);
        auditDir = path(p, AUDIT_DIR);
        String missing = auditSigningKey == null ? AUDIT_SIGNING_KEY : auditDir == null ? AUDIT_DIR : null;
        if (missing != null && (level.requiresAuditTrail() || auditSigningKey != null || auditDir != null)) {
            throw new IllegalArgumentException((level.requiresAuditTrail() ? level + " writes a signed audit trail"
                    : "the audit trail needs both " + AUDIT_SIGNING_KEY + " and " + AUDIT_DIR) + "; " + missing + " is not set");
        }
        auditShippers = parseShippers(p.getOrDefault(AUDIT_SHIP, "log"));
        auditCheckpointSeconds = parseLong(p, AUDIT_CHECKPOINT_SECONDS, 10, 0, 86_400);
    }

    private static List<CheckpointShipper> parseShippers(String value) {
        List<CheckpointShipper> shippers = new ArrayList<>();
        for (String target : value.split(",", -1)) {
            String t = target.strip();
            if (t.equals("log")) {
                shippers.add(CheckpointShipper.logLine());
            } else if (t.startsWith("file:") && !t.substring(5).isBlank()) {
                Path file = Path.of(t.substring(5));
                // NOTE: checked at start: a target that cannot take a line fails every checkpoint's shipping (a warning
                // each) while the pool serves, and the trail is then rewritable by whoever holds the host's key
                Path dir = file.toAbsolutePath().getParent();
                boolean appendable = Files.exists(file) ? Files.isRegularFile(file) && Files.isWritable(file)
                        : dir != null && Files.isDirectory(dir) && Files.isWritable(dir);
                if (!appendable) {
                    throw new IllegalArgumentException(AUDIT_SHIP + " target '" + target.strip() + "' cannot be appended to: "
                            + (Files.exists(file) ? "not a writable regular file" : "its directory " + dir + " does not exist or is not writable"));
                }
                shippers.add(CheckpointShipper.appendingTo(file));
            } else {
                throw new IllegalArgumentException(AUDIT_SHIP + " ships checkpoints to 'log' or 'file:PATH', comma-separated: '"
                        + target + "' in '" + value + "'");
            }
        }
        return List.copyOf(shippers);
    }

    /**
     * Parses properties; unknown keys and bad values fail naming the key, the value (never {@value #ROOT_KEY}'s)
     * and what is allowed. A setting given empty (or blanks only) is refused, not read as its default: a template that
     * left {@code KVSHIELD_LEVEL=} blank would otherwise run a weaker level than the one meant; so is one holding a
     * control character.
     */
    public static BridgeSettings parse(Map<String, String> properties) {
        Map<String, String> p = new TreeMap<>(properties);
        for (Map.Entry<String, String> e : p.entrySet()) {
            String k = e.getKey();
            if (!KEYS.contains(k)) {
                throw new IllegalArgumentException("unknown bridge setting '" + k + "'; allowed: " + KEYS);
            }
            String v = e.getValue() == null ? "" : unpadded(e.getValue());
            if (v.isEmpty()) {
                throw new IllegalArgumentException(k + " is set but empty: give it a value or leave it unset");
            }
            if (v.chars().anyMatch(c -> c < 0x20 || c == 0x7f)) {
                throw new IllegalArgumentException(k + " holds a control character: " + (k.equals(ROOT_KEY)
                        ? "not shown, it may be key material (" + e.getValue().length() + " characters)" : shown(e.getValue())));
            }
        }
        return new BridgeSettings(p);
    }

    /**
     * {@code v} without the blanks an env file leaves around a value (space, tab, CR, LF). Nothing else is
     * dropped or folded: a control character or a look-alike letter ({@code ı}, which upper-cases to {@code I})
     * stays, so the value is refused rather than read as the name it resembles.
     */
    private static String unpadded(String v) {
        int from = 0;
        int to = v.length();
        while (from < to && " \t\r\n".indexOf(v.charAt(from)) >= 0) {
            from++;
        }
        while (to > from && " \t\r\n".indexOf(v.charAt(to - 1)) >= 0) {
            to--;
        }
        return v.substring(from, to);
    }

    /** {@code v} quoted for a refusal, every character outside printable ASCII as {@code \\uXXXX}. */
    static String shown(String v) {
        StringBuilder b = new StringBuilder("'");
        v.chars().forEach(c -> b.append(c >= 0x20 && c < 0x7f ? String.valueOf((char) c) : String.format("\\u%04x", c)));
        return b.append('\'').toString();
    }

    /** An enum constant by its name, ASCII letters in any case (the value unpadded); anything else refused. */
    private static <E extends Enum<E>> E parseEnum(Map<String, String> p, String key, Class<E> type, E fallback) {
        String v = p.get(key);
        if (v == null) {
            return fallback;
        }
        String name = unpadded(v);
        for (E e : type.getEnumConstants()) {
            if (name.matches("[A-Za-z_]+") && e.name().equalsIgnoreCase(name)) {
                return e;
            }
        }
        throw new IllegalArgumentException(key + " must be one of " + java.util.Arrays.toString(type.getEnumConstants())
                + ": " + shown(v));
    }

    private static boolean parseBoolean(Map<String, String> p, String key) {
        String v = p.getOrDefault(key, "false");
        String b = unpadded(v);
        if (!b.equalsIgnoreCase("true") && !b.equalsIgnoreCase("false") || !b.matches("[A-Za-z]+")) {
            throw new IllegalArgumentException(key + " must be true or false: " + shown(v));
        }
        return b.equalsIgnoreCase("true");
    }

    /** An integer of ASCII digits (Long.parseLong would also take other scripts' digits), in [min, max]. */
    private static long parseLong(Map<String, String> p, String key, long fallback, long min, long max) {
        String v = p.get(key);
        if (v == null) {
            return fallback;
        }
        try {
            String digits = unpadded(v);
            if (!digits.matches("-?[0-9]{1,19}")) {
                throw new NumberFormatException();
            }
            long n = Long.parseLong(digits);
            if (n < min || n > max) {
                throw new NumberFormatException();
            }
            return n;
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(key + " must be an integer in [" + min + ", " + max + "]: " + shown(v));
        }
    }

    private static RootKeySource parseRootKey(String spec) {
        String v = unpadded(spec);
        if (v.startsWith("file:") && v.length() > 5) {
            return RootKeySource.keyFile(Path.of(v.substring(5)));
        }
        if (v.startsWith("fd:")) {
            try {
                return RootKeySource.inheritedFd(Integer.parseInt(v.substring(3)));
            } catch (NumberFormatException e) {
                // falls through to the error below
            }
        }
        if (v.equals("ephemeral")) {
            return RootKeySource.ephemeral();
        }
        // NOTE: a value of no known form may be the key itself pasted in: never echoed, only a scheme it names
        int colon = v.indexOf(':');
        String scheme = colon > 0 && colon <= 16 && v.substring(0, colon).chars().allMatch(Character::isLetter) ? v.substring(0, colon + 1) : null;
        throw new IllegalArgumentException(ROOT_KEY + " must be file:PATH, fd:N or ephemeral: " + (scheme != null ? "'" + scheme + "...'"
                : "the value given (" + spec.length() + " characters) is none of them; not shown, it may be key material"));
    }

    private static PageSealerFactory loadSealer(String className) {
        try {
            Object o = Class.forName(className, true, BridgeSettings.class.getClassLoader()).getDeclaredConstructor().newInstance();
            if (o instanceof PageSealerFactory f) {
                return f;
            }
            throw new IllegalArgumentException(SEALER_FACTORY + " '" + className + "' is not a " + PageSealerFactory.class.getName());
        } catch (ReflectiveOperationException | LinkageError e) {
            throw new IllegalArgumentException(SEALER_FACTORY + " '" + className + "' cannot be instantiated (is tenant-keys on"
                    + " the class path?): " + e, e);
        }
    }

    /**
     * A path setting, or null when absent; a blank one is refused (an empty path would name the working directory), as
     * is one holding a control character (a trailing newline would name another file than the one shown).
     */
    private static Path path(Map<String, String> p, String key) {
        String v = p.get(key);
        if (v != null && (v.isBlank() || !v.equals(v.strip()))) {
            throw new IllegalArgumentException(key + " must name a path, without blanks around it or control characters: "
                    + shown(v));
        }
        return v == null ? null : Path.of(v);
    }
}
