package dev.kvshield.handle;

/**
 * Codec of page handles. A handle is a {@code long}:
 *
 * <pre>
 *  63 62                             32 31                              0
 * +--+--------------------------------+--------------------------------+
 * | 0|   generation (31 bits, >= 1)   |       page index (32 bits)     |
 * +--+--------------------------------+--------------------------------+
 * </pre>
 *
 * <ul>
 *   <li>Bit 63 is always 0, so every valid handle is positive and {@link #NONE} (0) is never one:
 *       generations start at {@link #FIRST_GENERATION}.
 *   <li>The generation is the page's generation while the handle's holder owns it. Release bumps the
 *       page's generation before any protection work, so every handle of the old owner is stale
 *       from that moment on.
 *   <li>A page whose generation reaches {@link #MAX_GENERATION} is retired, never reused, so a
 *       generation never wraps back to a value an old handle could still carry.
 * </ul>
 *
 * <p>Pure functions; thread-safe.
 */
public final class PageHandles {
    /** "No page": returned where a page was asked for and none could be given. */
    public static final long NONE = 0L;
    /** The generation of a page that was never handed out. */
    public static final int FIRST_GENERATION = 1;
    /** The last generation a page reaches; a page released into it is retired. */
    public static final int MAX_GENERATION = Integer.MAX_VALUE;

    private static final long INDEX_MASK = 0xFFFF_FFFFL;

    private PageHandles() {}

    public static long encode(int page, int generation) {
        if (page < 0 || generation < FIRST_GENERATION) {
            throw new InvalidHandleException("cannot encode a handle for page=" + page + " generation=" + generation);
        }
        return ((long) generation << 32) | (page & INDEX_MASK);
    }

    /** The page index; meaningful only for a handle that {@link #isWellFormed} accepts. */
    public static int page(long handle) {
        return (int) (handle & INDEX_MASK);
    }

    /** The generation; meaningful only for a handle that {@link #isWellFormed} accepts. */
    public static int generation(long handle) {
        return (int) (handle >>> 32);
    }

    /** True for a handle that could have been produced by {@link #encode}: positive, generation >= 1, index >= 0. */
    public static boolean isWellFormed(long handle) {
        return handle > 0 && generation(handle) >= FIRST_GENERATION && (handle & 0x8000_0000L) == 0;
    }

    /**
     * The sealed reference of a page released under {@code ENCRYPT}: the same page at the generation
     * the release moved it to. Its owner presents it to reclaim the page.
     */
    public static long sealedReference(long releasedHandle) {
        return encode(page(releasedHandle), generation(releasedHandle) + 1);
    }

    public static String describe(long handle) {
        return isWellFormed(handle)
                ? "page=" + page(handle) + " generation=" + generation(handle)
                : "malformed handle 0x" + Long.toHexString(handle);
    }
}
