package dev.kvshield.bridge.handoff;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Both sides of prefill-to-decode handoffs on one bridged pool, keyed by SGLang's request ids (the
 * dense longs the Python side maps {@code rid} strings to) and page ids.
 *
 * <ul>
 *   <li>Decode: {@link #reserve} (admission first, pages, writer claims; the allocator's page table
 *       learns the pages), the transport's evidence ({@link #recordWritten}, or a copy through the
 *       claims), {@link #commit} with the sender's published coverage, {@link #acknowledge} on the
 *       transport's completion or abort acknowledgement, {@link #abort}, {@link #expire} (fence,
 *       alarm, back-pressure; never a free), {@link #finish}.
 *   <li>Prefill: {@link #begin} (admission first: an oversized request throws before any claim),
 *       reader claims on the request's own pages, {@link #markSent}, {@link #complete}.
 *   <li>Both: {@link #handshake} compares effective request limits and refuses a mismatch naming
 *       both numbers.
 *   <li>{@link #copyTo}: the in-process transport (a tensor copy read through the sender's claims
 *       and written through the receiver's, only between requests of one tenant), for tests and the
 *       simulation.
 * </ul>
 *
 * <p>Every entry point refuses a request id the pool keeps for its own holders, or a negative one,
 * before anything changes ({@link SlotAllocator#requestHolder}): such a request's pages would be
 * the unattributed holder's, or break {@link SlotAllocator#releaseAll}.
 *
 * <p>Called from the scheduler thread only, like {@link SlotAllocator}. Not a per-token path: one
 * call per request event.
 *
 * <p>Implementation notes: the reserved pages join the request's page list in the
 * {@link SlotAllocator}, so SGLang's frees in the request's release present the request's own leases
 * (the reservation's, or its owner leases once committed). Refusals, aborts and expiries release the
 * pages inside the receiver; each such call then drops the pages the request no longer holds from
 * its list, so a later free of those slots is refused as a free of pages the request does not hold.
 */
public final class HandoffBridge implements AutoCloseable {
    private final SlotAllocator slots;
    private final HandoffReceiver receiver;
    private final HandoffSender sender;
    private final Map<Long, Reservation> reservations = new HashMap<>();
    private final Map<Long, HandoffSender.Transfer> transfers = new HashMap<>();
    /** Finished requests whose transfer has not acknowledged yet: forgotten at the acknowledgement. */
    private final java.util.Set<Long> finished = new java.util.HashSet<>();
    private final List<String> alarms = new ArrayList<>();
    private final Arena arena = Arena.ofShared();
    private final MemorySegment scratch;

    public HandoffBridge(SlotAllocator slots) {
        this.slots = slots;
        this.receiver = new HandoffReceiver(slots.pool(), this::alarm);
        this.sender = new HandoffSender(slots.pool());
        PoolGeometry g = slots.pool().geometry();
        long maxPageBytes = 0;
        for (int b = 0; b < g.bufferCount(); b++) {
            maxPageBytes = Math.max(maxPageBytes, g.pageBytes(b));
        }
        this.scratch = arena.allocate(maxPageBytes);
    }

    private void alarm(String line) {
        synchronized (alarms) {
            alarms.add(line);
        }
    }

    /** This pool's effective request limit in tokens, sent to the peer in the handshake. */
    public long effectiveLimitTokens() {
        return receiver.effectiveLimitTokens();
    }

    /**
     * Records {@code peer} on both sides after checking it admits exactly what this pool admits.
     *
     * @throws dev.kvshield.admission.LimitMismatchException naming both limits; the peer stays unknown
     */
    public void handshake(long peer, long peerEffectiveTokens) {
        receiver.handshake(peer, peerEffectiveTokens);
        sender.handshake(peer, peerEffectiveTokens);
    }

    // ---------------------------------------------------------------- decode side

    /**
     * Reserves pages for an incoming request, writing their page ids (reservation order: page
     * {@code i} holds tokens {@code [i * pageSize, (i + 1) * pageSize)}) to {@code pagesOut}.
     *
     * @return the page count, or -1 when the pool cannot hold the request now (back-pressure; see
     *     {@link #lastShortfall})
     * @throws dev.kvshield.admission.RequestTooLongException before anything is reserved
     * @throws IllegalArgumentException for a reserved or negative request id, or a {@code pagesOut}
     *     shorter than the request's pages, before anything is reserved
     * @throws dev.kvshield.tenant.UnknownTenantException for an unregistered tenant, before anything is reserved
     * @throws IllegalStateException if the request already has a reservation, the peer never shook hands, or the
     *     allocator is closed
     * @throws dev.kvshield.tenant.ForeignAccessException if the request is another tenant's, before anything is reserved
     */
    public int reserve(long request, int tenant, long sequenceTokens, long peer, int[] pagesOut) {
        SlotAllocator.requestHolder(request);
        if (reservations.containsKey(request)) {
            throw new IllegalStateException("request " + request + " already has a reservation: " + reservations.get(request));
        }
        slots.pool().tenants().check(tenant);
        slots.checkListable(request, tenant); // NOTE: what recordRequestPages checks, before the pool changes
        slots.pool().admit(sequenceTokens);
        long pages = (sequenceTokens + slots.pageSizeTokens() - 1) / slots.pageSizeTokens();
        if (pagesOut.length < pages) {
            throw new IllegalArgumentException("pagesOut holds " + pagesOut.length + " pages; request " + request + " of "
                    + sequenceTokens + " tokens needs " + pages + ": nothing reserved");
        }
        Reservation r = receiver.reserve(tenant, request, sequenceTokens, peer);
        if (r == null) {
            return -1;
        }
        reservations.put(request, r);
        for (int i = 0; i < r.pageCount(); i++) {
            pagesOut[i] = r.page(i);
        }
        slots.recordRequestPages(request, pagesOut, r.pageCount(), 0);
        return r.pageCount();
    }

    /** Why the last {@link #reserve} answered -1: free, quarantined, claimed and owned pages. */
    public String lastShortfall() {
        return slots.pool().lastShortfall();
    }

    /** The transport reports it wrote slots {@code [fromSlot, toSlot)} of reserved page {@code pageIndex} itself. */
    public void recordWritten(long request, int pageIndex, int fromSlot, int toSlot) {
        receiver.recordWritten(reservation(request), pageIndex, fromSlot, toSlot);
    }

    /**
     * Decides the request against the coverage the sender published; a refusal releases its pages
     * (quarantined while the transfer's claims live).
     *
     * @return the verdict; {@link CommitResult#committed()} false means the client gets an abort
     */
    public CommitResult commit(long request, long coveredTokens) {
        Reservation r = reservation(request);
        CommitResult result = receiver.commit(r, coveredTokens);
        syncPages(r);
        return result;
    }

    /** The decode side cancels the request; its pages stay quarantined until the transfer acknowledges. */
    public void abort(long request) {
        Reservation r = reservation(request);
        receiver.abort(r);
        syncPages(r);
        forgetIfDone(request, r);
    }

    /** The transport acknowledged the transfer (completed or aborted): its claims drop. */
    public void acknowledge(long request) {
        Reservation r = reservation(request);
        receiver.acknowledge(r);
        forgetIfDone(request, r);
    }

    /** The transfer is overdue: claims fenced, alarm raised, pages stay quarantined (back-pressure). */
    public void expire(long request) {
        Reservation r = reservation(request);
        receiver.expire(r);
        syncPages(r);
    }

    /**
     * A committed request finished decoding: releases the reserved pages SGLang did not free itself.
     * The record is forgotten now if the transfer acknowledged, else at its acknowledgement.
     */
    public void finish(long request) {
        Reservation r = reservation(request);
        receiver.finish(r);
        syncPages(r);
        if (r.acknowledged()) {
            reservations.remove(request);
        } else {
            finished.add(request);
        }
    }

    /** Whether {@code request} still has a reservation record here. */
    public boolean hasReservation(long request) {
        SlotAllocator.requestHolder(request);
        return reservations.containsKey(request);
    }

    /** The reservation's outcome name ({@code PENDING}, {@code COMMITTED}, {@code REFUSED_COVERAGE}, ...). */
    public String outcome(long request) {
        return reservation(request).outcome().name();
    }

    /** Reservations whose transfer never acknowledged (their pages are held back). */
    public int unacknowledged() {
        return receiver.unacknowledged();
    }

    /** Alarms raised so far (one line each, no key material). */
    public String[] alarms() {
        synchronized (alarms) {
            return alarms.toArray(String[]::new);
        }
    }

    /** The request's reservation; refuses a reserved or negative request id like every entry point. */
    private Reservation reservation(long request) {
        SlotAllocator.requestHolder(request);
        Reservation r = reservations.get(request);
        if (r == null) {
            throw new IllegalStateException("request " + request + " has no handoff reservation on this pool");
        }
        return r;
    }

    /** Drops the reservation's pages the request no longer holds from its page list. */
    private void syncPages(Reservation r) {
        for (int i = 0; i < r.pageCount(); i++) {
            if (!slots.pool().view().isLive(r.lease(i)) && slots.requestOf(r.page(i)) == r.request()) {
                slots.forgetPage(r.page(i));
            }
        }
    }

    private void forgetIfDone(long request, Reservation r) {
        if (r.acknowledged() && (r.outcome().failsRequest() || finished.remove(request))) {
            reservations.remove(request);
        }
    }

    // ---------------------------------------------------------------- prefill side

    /**
     * Starts sending a request's KV from its pages ({@code sourcePages}, token order). Admission runs
     * first: an oversized request throws {@link dev.kvshield.admission.RequestTooLongException}, no
     * claim is taken and nothing is sent.
     *
     * @throws IllegalArgumentException for a reserved or negative request id, or if the request does
     *     not hold a source page as its owner now
     * @throws dev.kvshield.tenant.UnknownTenantException for an unregistered tenant
     */
    public void begin(long request, int tenant, long requestTokens, int[] sourcePages, long peer) {
        long owner = SlotAllocator.requestHolder(request);
        slots.pool().tenants().check(tenant);
        if (transfers.containsKey(request)) {
            throw new IllegalStateException("request " + request + " already has an outgoing transfer");
        }
        slots.pool().admit(requestTokens);
        long[] leases = new long[sourcePages.length];
        slots.pool().view().leasesOf(sourcePages, 0, sourcePages.length, tenant, owner, LeaseKind.OWNER, leases, 0);
        for (int i = 0; i < sourcePages.length; i++) {
            if (leases[i] == LeaseIds.NONE) {
                throw new IllegalArgumentException("source page " + sourcePages[i] + " (index " + i + ") is not held by request "
                        + request + " of tenant " + tenant + " now");
            }
        }
        transfers.put(request, sender.begin(tenant, request, requestTokens, leases, peer));
    }

    /** Records tokens {@code [0, tokens)} as sent: the coverage the decode side checks. */
    public void markSent(long request, long tokens) {
        sender.markSent(transfer(request), tokens);
    }

    /** Tokens sent so far (the coverage to publish). */
    public long sentTokens(long request) {
        return transfer(request).sentTokens();
    }

    /** The transport acknowledged the transfer: the source pages' reader claims drop. */
    public void complete(long request) {
        sender.complete(transfer(request));
        transfers.remove(request);
    }

    /** The request's outgoing transfer; refuses a reserved or negative request id like every entry point. */
    private HandoffSender.Transfer transfer(long request) {
        SlotAllocator.requestHolder(request);
        HandoffSender.Transfer t = transfers.get(request);
        if (t == null) {
            throw new IllegalStateException("request " + request + " has no outgoing transfer on this pool");
        }
        return t;
    }

    // ---------------------------------------------------------------- in-process transport

    /**
     * Copies pages {@code [fromPage, toPage)} of {@code request}'s tokens, every buffer, from this
     * (prefill) pool to {@code decode}'s reservation for {@code decodeRequest} (each side numbers
     * requests itself): read through this side's reader claims,
     * written through the decode side's writer claims (a fenced, dropped or stale claim throws and
     * writes nothing; so does a decode pool of another token layout, {@link #layoutMismatch}, refused
     * naming both values before any byte moves). Does not publish coverage; call {@link #markSent}.
     *
     * @return tokens copied
     */
    public long copyTo(HandoffBridge decode, long request, long decodeRequest, int fromPage, int toPage) {
        HandoffSender.Transfer t = transfer(request);
        Reservation r = decode.reservation(decodeRequest);
        String senderTenant = slots.tenantName(t.tenant());
        String receiverTenant = decode.slots.tenantName(r.tenant());
        if (!senderTenant.equals(receiverTenant)) { // NOTE: tenant ids are each pool's own; names are what both sides share
            String line = "handoff refused: request " + request + " of tenant " + senderTenant + " would land in request " + decodeRequest
                    + "'s reservation of tenant " + receiverTenant + " (a colliding or reused pairing); nothing copied";
            alarm(line);
            decode.alarm(line);
            throw new IllegalArgumentException(line);
        }
        PoolGeometry g = slots.pool().geometry();
        String mismatch = layoutMismatch(g, decode.slots.pool().geometry());
        if (mismatch != null) { // NOTE: buffer b of page i is copied to buffer b of page i: any other layout misplaces KV
            throw new IllegalArgumentException("handoff refused: request " + request + "'s KV layout does not match the decode pool's ("
                    + mismatch + "); nothing copied");
        }
        int pageSize = g.pageSizeTokens();
        if (fromPage < 0 || toPage > t.pageCount() || toPage > r.pageCount() || fromPage > toPage) {
            throw new IllegalArgumentException("pages [" + fromPage + ", " + toPage + ") outside the transfer's " + t.pageCount()
                    + " source and " + r.pageCount() + " reserved pages");
        }
        long copied = 0;
        for (int i = fromPage; i < toPage; i++) {
            int tokens = (int) Math.min(pageSize, t.requestTokens() - (long) i * pageSize);
            for (int b = 0; b < g.bufferCount(); b++) {
                MemorySegment part = scratch.asSlice(0, (long) tokens * g.bytesPerToken(b));
                sender.read(t, i, b, 0, part);
                decode.receiver.write(r, i, b, 0, part);
            }
            copied += tokens;
        }
        return copied;
    }

    /**
     * The first difference, prefill's value then decode's, between two pools' token layouts (page size, buffers,
     * each buffer's kind and bytes per token; labels name an engine's classes and may differ), or {@code null}
     * when a token copies buffer for buffer.
     */
    static String layoutMismatch(PoolGeometry prefill, PoolGeometry decode) {
        if (prefill.pageSizeTokens() != decode.pageSizeTokens()) {
            return "page size " + prefill.pageSizeTokens() + " tokens, decode " + decode.pageSizeTokens();
        }
        if (prefill.bufferCount() != decode.bufferCount()) {
            return prefill.bufferCount() + " KV buffers, decode " + decode.bufferCount();
        }
        for (int b = 0; b < prefill.bufferCount(); b++) {
            if (prefill.kindOf(b) != decode.kindOf(b) || prefill.bytesPerToken(b) != decode.bytesPerToken(b)) {
                return prefill.describeBuffer(b) + " of " + prefill.bytesPerToken(b) + " bytes per token, decode "
                        + decode.describeBuffer(b) + " of " + decode.bytesPerToken(b);
            }
        }
        return null;
    }

    @Override
    public void close() {
        arena.close();
    }
}
