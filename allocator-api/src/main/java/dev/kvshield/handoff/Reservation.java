package dev.kvshield.handoff;

import dev.kvshield.handle.PageHandles;

/**
 * The decode side's record of one incoming request: its reserved pages with their generations
 * (inside the handles), the transfer's writer claims on them, and where it ended. Changed only by its
 * {@link HandoffReceiver}; safe to read from any thread.
 */
public final class Reservation {
    private final int tenant;
    private final long request;
    private final long sequenceTokens;
    private final long peer;
    private final long[] handles;
    private final long[] claims;
    volatile HandoffOutcome outcome = HandoffOutcome.PENDING;
    volatile boolean released;
    volatile boolean acknowledged;

    final HandoffReceiver receiver;
    /** When the transfer was acknowledged before commit: the first reserved page it had not written (-1: none). */
    volatile int firstUnwrittenAtAck = -1;

    Reservation(HandoffReceiver receiver, int tenant, long request, long sequenceTokens, long peer, long[] handles, long[] claims) {
        this.receiver = receiver;
        this.tenant = tenant;
        this.request = request;
        this.sequenceTokens = sequenceTokens;
        this.peer = peer;
        this.handles = handles;
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
        return handles.length;
    }

    /** The handle of reserved page {@code i} (its generation is the one the transfer must write in). */
    public long handle(int i) {
        return handles[checkIndex(i)];
    }

    /** The transfer's writer claim on reserved page {@code i}. */
    public long claim(int i) {
        return claims[checkIndex(i)];
    }

    private int checkIndex(int i) {
        if (i < 0 || i >= handles.length) {
            throw new IllegalArgumentException("reserved page index " + i + " is outside [0, " + handles.length + ") of request "
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

    long[] handles() {
        return handles;
    }

    long[] claims() {
        return claims;
    }

    @Override
    public String toString() {
        return "Reservation[tenant=" + tenant + " request=" + request + " sequenceTokens=" + sequenceTokens + " pages="
                + handles.length + " first=" + (handles.length > 0 ? PageHandles.describe(handles[0]) : "none") + " outcome="
                + outcome + "]";
    }
}
