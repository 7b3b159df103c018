package dev.kvshield.tenant;

/**
 * Codec of owner references: who, inside a tenant, owns a page.
 *
 * <pre>
 *  63 62                                                               0
 * +--+------------------------------------------------------------------+
 * |ns|     request id (ns = 0) or cache namespace id (ns = 1), >= 0      |
 * +--+------------------------------------------------------------------+
 * </pre>
 *
 * A request owns the pages it is computing; a cache namespace (a prefix cache) owns pages that
 * outlive their request. Ids are chosen by the engine and must be in {@code [0, 2^62)}.
 */
public final class Owners {
    /** No owner (a page that is not OWNED). */
    public static final long NOBODY = -1L;
    private static final long NAMESPACE_BIT = 1L << 62;
    private static final long MAX_ID = NAMESPACE_BIT - 1;
    /**
     * The owner an engine's pages and frees outside any request are held and recorded under: request
     * id {@code 2^62 - 1}, which no request gets. The audit tools print it as {@code unattributed}.
     */
    public static final long UNATTRIBUTED = MAX_ID;

    private Owners() {}

    public static long request(long requestId) {
        checkId("request", requestId);
        return requestId;
    }

    public static long namespace(long namespaceId) {
        checkId("namespace", namespaceId);
        return NAMESPACE_BIT | namespaceId;
    }

    public static boolean isNamespace(long owner) {
        return owner >= 0 && (owner & NAMESPACE_BIT) != 0;
    }

    public static boolean isValid(long owner) {
        return owner >= 0;
    }

    public static long id(long owner) {
        return owner & MAX_ID;
    }

    public static String describe(long owner) {
        if (owner == NOBODY) {
            return "nobody";
        }
        if (!isValid(owner)) {
            return "invalid owner 0x" + Long.toHexString(owner);
        }
        return (isNamespace(owner) ? "namespace " : "request ") + id(owner);
    }

    private static void checkId(String what, long id) {
        if (id < 0 || id > MAX_ID) {
            throw new IllegalArgumentException(what + " id must be in [0, 2^62): " + what + "=" + id);
        }
    }
}
