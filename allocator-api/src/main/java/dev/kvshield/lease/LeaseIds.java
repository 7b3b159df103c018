package dev.kvshield.lease;

/**
 * Codec of lease ids. A lease id is a {@code long}:
 *
 * <pre>
 *  63 62                                                                0
 * +--+-------------------------------------------------------------------+
 * | 0|            serial (63 bits, >= 1), from one counter per pool       |
 * +--+-------------------------------------------------------------------+
 * </pre>
 *
 * <ul>
 *   <li>Serials come from one counter per pool that only grows: an id is never reused in the
 *       pool's lifetime, so a stale id can never equal a live one. When the counter would pass
 *       {@link #MAX_ID} the pool mints no more leases and says so
 *       ({@link LeaseIdsExhaustedException}); it never wraps.
 *   <li>{@link #NONE} (0) is never a lease: "no lease", e.g. where a reclaim found nothing.
 *   <li>An id says nothing about its page: the pool looks it up. Which table slot holds a live
 *       lease is the table's business ({@link LeaseTable}), not part of the id.
 * </ul>
 *
 * <p>Pure functions; thread-safe.
 */
public final class LeaseIds {
    /** "No lease". */
    public static final long NONE = 0L;
    /** The first id a pool mints. */
    public static final long FIRST_ID = 1L;
    /** The last id a pool may mint. */
    public static final long MAX_ID = Long.MAX_VALUE;

    private LeaseIds() {}

    /** True for an id a pool could have minted: positive. */
    public static boolean isWellFormed(long lease) {
        return lease >= FIRST_ID;
    }

    public static String describe(long lease) {
        return isWellFormed(lease) ? "lease " + lease : "malformed lease 0x" + Long.toHexString(lease);
    }
}
