package dev.kvshield.lease;

/**
 * Codec of one pool's lease ids. A lease id is a {@code long}:
 *
 * <pre>
 *  63 62                                  b b-1                       0
 * +--+-------------------------------------+---------------------------+
 * | 0|   serial (63 - b bits, >= 1)        |   page index (b bits)      |
 * +--+-------------------------------------+---------------------------+
 *   b = {@link #pageBits()}: the fewest bits that hold every page index of the pool (at least 1)
 * </pre>
 *
 * <ul>
 *   <li>Serials come from one counter per pool that only grows, so an id is never reused in the
 *       pool's lifetime: a stale id can never equal a live one. When the counter would pass
 *       {@link #maxSerial()} the pool mints no more leases and says so
 *       ({@link LeaseIdsExhaustedException}); it never wraps. With {@code b} page bits there are
 *       {@code 2^(63-b) - 1} serials: 2^42 for a pool of two million pages.
 *   <li>The page is part of the id, so a lease names its page even after it is dead (diagnostics,
 *       and "this lease was presented for another page" is impossible by construction).
 *   <li>{@link #NONE} (0) is never a lease: "no lease", e.g. where a reclaim found nothing.
 * </ul>
 *
 * <p>Immutable; thread-safe.
 */
public final class LeaseIds {
    /** "No lease". */
    public static final long NONE = 0L;

    private final int pageCount;
    private final int pageBits;
    private final long pageMask;
    private final long maxSerial;

    public LeaseIds(int pageCount) {
        if (pageCount < 1) {
            throw new IllegalArgumentException("a pool has at least one page: pageCount=" + pageCount);
        }
        this.pageCount = pageCount;
        this.pageBits = Math.max(1, 32 - Integer.numberOfLeadingZeros(pageCount - 1));
        this.pageMask = (1L << pageBits) - 1;
        this.maxSerial = (1L << (63 - pageBits)) - 1;
    }

    public int pageBits() {
        return pageBits;
    }

    /** The largest serial: the pool's lease counter never passes it. */
    public long maxSerial() {
        return maxSerial;
    }

    public long encode(long serial, int page) {
        if (serial < 1 || serial > maxSerial || page < 0 || page >= pageCount) {
            throw unencodable(serial, page);
        }
        return (serial << pageBits) | page;
    }

    private IllegalArgumentException unencodable(long serial, int page) {
        return new IllegalArgumentException("cannot encode a lease for serial=" + serial + " page=" + page + " (serials 1.."
                + maxSerial + ", pages 0.." + (pageCount - 1) + ")");
    }

    /** True for an id this pool could have minted: positive, a serial >= 1, a page of the pool. */
    public boolean isWellFormed(long lease) {
        return lease > 0 && (lease >>> pageBits) >= 1 && (lease & pageMask) < pageCount;
    }

    /** The page a lease names, live or dead; meaningful only when {@link #isWellFormed}. */
    public int page(long lease) {
        return (int) (lease & pageMask);
    }

    public long serial(long lease) {
        return lease >>> pageBits;
    }

    public String describe(long lease) {
        return isWellFormed(lease) ? "lease " + lease + " (page " + page(lease) + ")" : "malformed lease 0x" + Long.toHexString(lease);
    }
}
