package dev.kvshield.handoff;

import dev.kvshield.claims.ClaimKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.MemorySegment;
import java.util.HashMap;
import java.util.Map;

/**
 * The prefill side of handoffs on one pool: admission before anything (a request rejected for
 * length never starts a handoff and its error reaches the client), reader claims on the source pages
 * for the transfer's whole life, reads only of slots written in the pages' current generation, and
 * the coverage it actually sent for the decode side to check. Thread-safe.
 */
public final class HandoffSender {
    private final KvPagePool pool;
    private final Map<Long, Long> peerLimits = new HashMap<>();

    public HandoffSender(KvPagePool pool) {
        this.pool = pool;
    }

    /** Records a peer after checking it admits exactly what this pool admits. */
    public synchronized void handshake(long peer, long peerEffectiveTokens) {
        pool.admission().checkAgrees(peerEffectiveTokens);
        peerLimits.put(peer, peerEffectiveTokens);
    }

    public long effectiveLimitTokens() {
        return pool.admission().effectiveTokens();
    }

    /** One outgoing transfer: the source pages' reader claims and the tokens sent so far. */
    public static final class Transfer {
        private final int tenant;
        private final long request;
        private final long requestTokens;
        private final long[] sourceLeases;
        private final long[] claims;
        private long sentTokens;
        private boolean completed;

        private final HandoffSender sender;

        Transfer(HandoffSender sender, int tenant, long request, long requestTokens, long[] sourceLeases, long[] claims) {
            this.sender = sender;
            this.tenant = tenant;
            this.request = request;
            this.requestTokens = requestTokens;
            this.sourceLeases = sourceLeases;
            this.claims = claims;
        }

        public int tenant() {
            return tenant;
        }

        public long request() {
            return request;
        }

        public long requestTokens() {
            return requestTokens;
        }

        public int pageCount() {
            return sourceLeases.length;
        }

        /** Tokens sent, counted from the first: what the sender publishes as coverage. */
        public synchronized long sentTokens() {
            return sentTokens;
        }

        public synchronized boolean completed() {
            return completed;
        }
    }

    /**
     * Starts a transfer of a request's KV. Admission runs first: an oversized request throws
     * {@link dev.kvshield.admission.RequestTooLongException} here and no claim is taken, no byte
     * sent.
     *
     * @throws IllegalStateException if no handshake with {@code peer} happened
     */
    public synchronized Transfer begin(int tenant, long request, long requestTokens, long[] sourceLeases, long peer) {
        pool.admit(requestTokens);
        if (!peerLimits.containsKey(peer)) {
            throw new IllegalStateException("no handshake with peer " + peer + ": limits were never compared");
        }
        int pageSize = pool.geometry().pageSizeTokens();
        long needed = (requestTokens + pageSize - 1) / pageSize;
        if (sourceLeases.length != needed) {
            throw new IllegalArgumentException("request of " + requestTokens + " tokens needs " + needed + " source pages of "
                    + pageSize + " tokens, got " + sourceLeases.length);
        }
        long[] claims = new long[sourceLeases.length];
        pool.claim(tenant, Owners.request(request), sourceLeases, 0, sourceLeases.length, ClaimKind.READER, peer, claims, 0);
        return new Transfer(this, tenant, request, requestTokens, sourceLeases.clone(), claims);
    }

    /**
     * Reads token slots of source page {@code pageIndex} for sending; slots must have been written
     * in the page's current generation (a read-before-write is an error, not data).
     */
    public void read(Transfer t, int pageIndex, int buffer, int slot, MemorySegment dst) {
        checkMine(t);
        if (pageIndex < 0 || pageIndex >= t.claims.length) {
            throw new IllegalArgumentException("source page index " + pageIndex + " is outside [0, " + t.claims.length
                    + ") of request " + t.request());
        }
        pool.read(t.tenant, Owners.request(t.request), t.claims[pageIndex], buffer, slot, dst);
    }

    /** Records that tokens {@code [0, tokens)} were sent (monotonic). */
    public void markSent(Transfer t, long tokens) {
        checkMine(t);
        synchronized (t) {
            if (tokens < t.sentTokens || tokens > t.requestTokens) {
                throw new IllegalArgumentException("sent tokens must grow within [" + t.sentTokens + ", " + t.requestTokens + "]: "
                        + tokens);
            }
            t.sentTokens = tokens;
        }
    }

    /** The transport acknowledged the transfer: drops the reader claims on the source pages. */
    public void complete(Transfer t) {
        checkMine(t);
        synchronized (t) {
            if (!t.completed) {
                pool.dropClaims(t.tenant, Owners.request(t.request), t.claims, 0, t.claims.length);
                t.completed = true;
            }
        }
    }

    private void checkMine(Transfer t) {
        if (t.sender != this) {
            throw new IllegalArgumentException("transfer of request " + t.request() + " belongs to another sender (pool "
                    + t.sender.pool.config().poolId() + "), not to pool " + pool.config().poolId());
        }
    }
}
