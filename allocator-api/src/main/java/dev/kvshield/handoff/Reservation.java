package dev.kvshield.handoff;

import java.util.Arrays;

/**
 * The decode side's record of one incoming request: the leases on its reserved pages (a
 * {@code RESERVATION} until commit, the request's {@code OWNER} leases after), the pages, the
 * transfer's writer claims on them, and where it ended. Changed only by its {@link HandoffReceiver};
 * safe to read from any thread.
 */
public final class Reservation {
    private final int tenant;
    private final long request;
    private final long sequenceTokens;
    private final long peer;
    private final int[] pages;
    private final long[] claims;
    volatile long[] leases;
    volatile HandoffOutcome outcome = HandoffOutcome.PENDING;
    volatile boolean released;
    volatile boolean acknowledged;

    final HandoffReceiver receiver;
    /** When the transfer was acknowledged before commit: the first reserved page it had not written (-1: none). */
    volatile int firstUnwrittenAtAck = -1;

    Reservation(HandoffReceiver receiver, int tenant, long request, long sequenceTokens, long peer, long[] leases, int[] pages,
            long[] claims) {
        this.receiver = receiver;
        this.tenant = tenant;
        this.request = request;
        this.sequenceTokens = sequenceTokens;
        this.peer = peer;
        this.leases = leases;
        this.pages = pages;
        this.claims = claims;
    }

    public int tenant() {
        return tenant;
    }

    public long request() {
        return request;
    }

    public long sequenceTokens() {
        return sequenceTokens;
    }

    public long peer() {
        return peer;
    }

    public int pageCount() {
        return pages.length;
    }

    /** The pool page of reserved page {@code i}. */
    public int page(int i) {
        return pages[checkIndex(i)];
    }

    /** The request's lease on reserved page {@code i}: its reservation before commit, its owner lease after. */
    public long lease(int i) {
        return leases[checkIndex(i)];
    }

    /** The transfer's writer claim on reserved page {@code i}. */
    public long claim(int i) {
        return claims[checkIndex(i)];
    }

    private int checkIndex(int i) {
        if (i < 0 || i >= pages.length) {
            throw new IllegalArgumentException("reserved page index " + i + " is outside [0, " + pages.length + ") of request "
                    + request);
        }
        return i;
    }

    public HandoffOutcome outcome() {
        return outcome;
    }

    public boolean acknowledged() {
        return acknowledged;
    }

    long[] claims() {
        return claims;
    }

    @Override
    public String toString() {
        return "Reservation[tenant=" + tenant + " request=" + request + " sequenceTokens=" + sequenceTokens + " pages="
                + Arrays.toString(pages.length > 8 ? Arrays.copyOf(pages, 8) : pages) + " outcome=" + outcome + "]";
    }
}
