package dev.kvshield.handoff;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import java.lang.foreign.MemorySegment;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.function.Consumer;

/**
 * The decode side of prefill-to-decode handoffs on one pool.
 *
 * <p>Life of a request: {@link #handshake} with the peer (effective limits must agree) →
 * {@link #reserve} (admission first, then pages, then a writer claim per page) → the transport
 * lands KV through the claims ({@link #write} or {@link #recordWritten}) → {@link #commit} with the
 * coverage the sender published → {@link #acknowledge} when the transport reports the transfer
 * complete or aborted, which drops the claims. A refused or aborted request's pages are released at
 * once, but stay quarantined while the claims live, so a late write lands only in quarantine and is
 * scrubbed. A transfer that never acknowledges is {@link #expire}d: its claims are fenced (later
 * writes fail), an alarm is raised, and its pages stay out of circulation — back-pressure, never a
 * free on timeout.
 *
 * <p>Thread-safe. Metrics: {@code kvshield.handoffs} (counter, tag {@code outcome}) and
 * {@code kvshield.handoff.unacknowledged} (gauge, reservations whose claims still hold pages).
 */
public final class HandoffReceiver {
    private final KvPagePool pool;
    private final Map<Long, Long> peerLimits = new HashMap<>();
    private final Map<HandoffOutcome, Counter> outcomes = new EnumMap<>(HandoffOutcome.class);
    private final Counter alarms;
    private final Consumer<String> alarmSink;
    private int unacknowledged;

    /**
     * @param alarmSink receives one line per alarm (an expired transfer), e.g. a log or pager hook
     */
    public HandoffReceiver(KvPagePool pool, Consumer<String> alarmSink) {
        this.pool = pool;
        this.alarmSink = alarmSink;
        MeterRegistry registry = pool.config().meterRegistry();
        Tags base = Tags.of("pool", pool.config().poolId(), "rank", Integer.toString(pool.config().rank()), "side", "decode");
        for (HandoffOutcome o : HandoffOutcome.values()) {
            if (o != HandoffOutcome.PENDING) {
                outcomes.put(o, Counter.builder("kvshield.handoffs").tags(base.and("outcome", o.name().toLowerCase(Locale.ROOT)))
                        .baseUnit("requests").register(registry));
            }
        }
        alarms = Counter.builder("kvshield.handoff.alarms").tags(base).baseUnit("transfers").register(registry);
        Gauge.builder("kvshield.handoff.unacknowledged", this, r -> r.unacknowledged()).tags(base).baseUnit("transfers")
                .register(registry);
    }

    /**
     * Records a peer after checking it admits exactly what this pool admits.
     *
     * @throws dev.kvshield.admission.LimitMismatchException naming both limits; the peer stays unknown
     */
    public synchronized void handshake(long peer, long peerEffectiveTokens) {
        pool.admission().checkAgrees(peerEffectiveTokens);
        peerLimits.put(peer, peerEffectiveTokens);
    }

    /** This side's effective request limit, to send in the handshake. */
    public long effectiveLimitTokens() {
        return pool.admission().effectiveTokens();
    }

    /**
     * Reserves pages for an incoming request and takes the transfer's writer claims on them.
     *
     * @return the reservation, or {@code null} when the pool cannot hold it now (the request waits:
     *     back-pressure), with {@link KvPagePool#lastShortfall()} saying why
     * @throws dev.kvshield.admission.RequestTooLongException before anything is reserved
     * @throws LeaseCapacityException before anything is reserved, when the pool cannot hold a
     *     reservation and a writer claim per page
     * @throws dev.kvshield.lease.LeaseIdsExhaustedException before anything is reserved, when the
     *     pool's lease ids cannot name them
     * @throws IllegalStateException if no handshake with {@code peer} happened
     */
    public synchronized Reservation reserve(int tenant, long request, long sequenceTokens, long peer) {
        if (!peerLimits.containsKey(peer)) {
            throw new IllegalStateException("no handshake with peer " + peer + ": limits were never compared");
        }
        pool.admit(sequenceTokens);
        int pageSize = pool.geometry().pageSizeTokens();
        int pages = (int) ((sequenceTokens + pageSize - 1) / pageSize);
        long owner = Owners.request(request);
        // Refuse before allocating: a refusal after the allocation would release the pages, not leave the pool as it was.
        pool.checkLeaseRoom(2 * pages, pages);
        long[] leases = new long[pages];
        if (!pool.allocate(tenant, owner, LeaseKind.RESERVATION, pages, leases, 0)) {
            return null;
        }
        long[] claims = new long[pages];
        try {
            pool.claim(tenant, owner, leases, 0, pages, ClaimKind.WRITER, peer, claims, 0);
        } catch (RuntimeException e) {
            pool.release(tenant, owner, leases, 0, pages, ReleaseReason.REJECTED);
            throw e;
        }
        int[] pageIds = new int[pages];
        pool.view().pagesOf(leases, 0, pages, pageIds, 0);
        unacknowledged++;
        return new Reservation(this, tenant, request, sequenceTokens, peer, leases, pageIds, claims);
    }

    /** The transport lands token slots of reserved page {@code pageIndex} (a copy through the claim). */
    public void write(Reservation r, int pageIndex, int buffer, int slot, MemorySegment src) {
        checkMine(r);
        pool.write(r.tenant(), Owners.request(r.request()), r.claim(pageIndex), buffer, slot, src);
    }

    /** The transport reports slots it wrote into reserved page {@code pageIndex} itself (RDMA, copy engine). */
    public void recordWritten(Reservation r, int pageIndex, int fromSlot, int toSlot) {
        checkMine(r);
        pool.markWritten(r.tenant(), Owners.request(r.request()), r.claim(pageIndex), fromSlot, toSlot);
    }

    /**
     * Decides the request: committed only if {@code coveredTokens >= sequenceTokens} and every slot
     * the sequence occupies on every reserved page was written through this transfer's claim while
     * the page was in the reserved generation. A commit turns the reservation into the request's
     * owner leases ({@link Reservation#lease}); a refusal releases the pages (they stay quarantined
     * while the claims live).
     */
    public synchronized CommitResult commit(Reservation r, long coveredTokens) {
        checkMine(r);
        if (r.outcome != HandoffOutcome.PENDING) {
            throw new IllegalStateException("reservation already ended as " + r.outcome + ": " + r);
        }
        if (coveredTokens < 0) {
            throw new IllegalArgumentException("coveredTokens must be >= 0: " + coveredTokens);
        }
        CommitResult result;
        if (coveredTokens < r.sequenceTokens()) {
            result = new CommitResult(HandoffOutcome.REFUSED_COVERAGE, r.sequenceTokens(), coveredTokens, -1,
                    "handoff refused: sender covered " + coveredTokens + " of " + r.sequenceTokens() + " tokens of request "
                            + r.request());
        } else {
            int bad = r.acknowledged ? firstUnwrittenAfterAck(r) : firstUnwrittenPage(r);
            result = bad < 0
                    ? new CommitResult(HandoffOutcome.COMMITTED, r.sequenceTokens(), coveredTokens, -1, "committed")
                    : new CommitResult(HandoffOutcome.REFUSED_UNWRITTEN, r.sequenceTokens(), coveredTokens, bad,
                            "handoff refused: reserved page " + bad + " of " + r.pageCount() + " (pool page " + r.page(bad)
                                    + ") of request " + r.request() + " was not written by this transfer");
        }
        if (result.committed()) {
            long[] owned = new long[r.pageCount()];
            pool.transfer(r.tenant(), Owners.request(r.request()), r.leases, 0, r.pageCount(), LeaseKind.OWNER,
                    Owners.request(r.request()), owned, 0);
            r.leases = owned;
        }
        r.outcome = result.outcome();
        outcomes.get(result.outcome()).increment();
        if (!result.committed()) {
            releaseOnce(r, ReleaseReason.REJECTED);
        }
        return result;
    }

    private int firstUnwrittenPage(Reservation r) {
        int pageSize = pool.geometry().pageSizeTokens();
        for (int i = 0; i < r.pageCount(); i++) {
            int used = (int) Math.min(pageSize, r.sequenceTokens() - (long) i * pageSize);
            if (!pool.view().isLive(r.lease(i)) || !pool.claimWrote(r.claim(i), 0, used)) {
                return i;
            }
        }
        return -1;
    }

    /** After the acknowledgement: the evidence kept then, and every reservation still held (its generation unchanged). */
    private int firstUnwrittenAfterAck(Reservation r) {
        if (r.firstUnwrittenAtAck >= 0) {
            return r.firstUnwrittenAtAck;
        }
        for (int i = 0; i < r.pageCount(); i++) {
            if (!pool.view().isLive(r.lease(i))) {
                return i;
            }
        }
        return -1;
    }

    private void checkMine(Reservation r) {
        if (r.receiver != this) {
            throw new IllegalArgumentException("reservation of request " + r.request() + " belongs to another receiver (pool "
                    + r.receiver.pool.config().poolId() + "), not to pool " + pool.config().poolId());
        }
    }

    /** The decode side cancels the request before commit; its pages are released, its claims stay until acknowledged. */
    public synchronized void abort(Reservation r) {
        checkMine(r);
        if (r.outcome == HandoffOutcome.PENDING) {
            r.outcome = HandoffOutcome.ABORTED;
            outcomes.get(HandoffOutcome.ABORTED).increment();
        }
        releaseOnce(r, ReleaseReason.ABORTED);
    }

    /**
     * The transport's evidence that the transfer is over (completed or aborted): drops the claims,
     * which lets released pages be protected and reused.
     */
    public synchronized void acknowledge(Reservation r) {
        checkMine(r);
        if (r.acknowledged) {
            return;
        }
        if (r.outcome == HandoffOutcome.PENDING) {
            // Transports usually report "done" before the request commits: keep the claims' evidence.
            r.firstUnwrittenAtAck = firstUnwrittenPage(r);
        }
        pool.dropClaims(r.tenant(), Owners.request(r.request()), r.claims(), 0, r.pageCount());
        r.acknowledged = true;
        unacknowledged--;
    }

    /**
     * The transfer is overdue and never acknowledged: fences its claims (any later write fails),
     * fails the request if it was pending, raises an alarm, and keeps the pages quarantined until an
     * acknowledgement (or an operator's drain) drops the claims. A timeout is never a free.
     */
    public synchronized void expire(Reservation r) {
        checkMine(r);
        if (r.acknowledged) {
            return;
        }
        pool.fenceClaims(r.tenant(), Owners.request(r.request()), r.claims(), 0, r.pageCount());
        if (r.outcome == HandoffOutcome.PENDING) {
            r.outcome = HandoffOutcome.EXPIRED;
            outcomes.get(HandoffOutcome.EXPIRED).increment();
        }
        releaseOnce(r, ReleaseReason.TIMEOUT);
        alarms.increment();
        alarmSink.accept("handoff alarm: transfer from peer " + r.peer() + " for request " + r.request() + " never acknowledged; "
                + r.pageCount() + " pages stay quarantined until it drains");
    }

    /**
     * Releases a committed request's pages when it finishes decoding: the owner leases it still
     * holds (pages the engine already handed on, e.g. into a prefix cache, are no longer its own).
     */
    public synchronized void finish(Reservation r) {
        checkMine(r);
        if (r.outcome != HandoffOutcome.COMMITTED) {
            throw new IllegalStateException("only a committed reservation finishes: " + r);
        }
        releaseOnce(r, ReleaseReason.FINISHED);
    }

    /** Releases the reservation's leases the request still holds (the engine may have freed or handed on some). */
    private void releaseOnce(Reservation r, ReleaseReason reason) {
        if (!r.released) {
            long[] held = java.util.Arrays.stream(r.leases).filter(pool.view()::isLive).toArray();
            pool.release(r.tenant(), Owners.request(r.request()), held, 0, held.length, reason);
            r.released = true;
        }
    }

    /** Reservations whose claims still hold pages (not acknowledged). */
    public synchronized int unacknowledged() {
        return unacknowledged;
    }

    public double alarmCount() {
        return alarms.count();
    }

    public double outcomeCount(HandoffOutcome outcome) {
        return outcomes.get(outcome).count();
    }
}
