package dev.kvshield.bridge.handoff;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The prefill side of SGLang's chunked KV sends on one bridged pool: reader claims on a request's
 * source pages, named host-side from the allocator's per-request page list, taken chunk by chunk
 * before the transport is handed each chunk, and held until the transport's evidence that it no
 * longer reads ({@link #complete}). A page SGLang releases while claimed stays quarantined (never
 * scrubbed, never handed out) until its claim drops, so a request aborted mid-transfer cannot have
 * its pages reused while the transport still reads them.
 *
 * <ul>
 *   <li>{@link #begin}: admission first (an oversized request throws
 *       {@link dev.kvshield.admission.RequestTooLongException} and nothing is recorded), no claim yet.
 *   <li>{@link #claim}: reader claims on the pages holding tokens {@code [0, endTokens)} not claimed
 *       yet, all or nothing; {@link #markSent} records what the transport was handed.
 *   <li>{@link #complete}: drops every claim (released pages are then protected and reused).
 *   <li>{@link #expire}: the transport never concluded: claims fenced, alarm raised, pages stay out
 *       of circulation (back-pressure) until a late {@link #complete}. A timeout is never a free.
 * </ul>
 *
 * <p>Called from the scheduler thread only, like {@link SlotAllocator}; one call per chunk, not per
 * token.
 *
 * <p>Implementation notes: allocator-api's {@code HandoffSender} claims all of a request's pages at
 * its begin; SGLang's chunked prefill hands the transport each chunk as soon as it is computed,
 * before later chunks' pages exist, so the claims here grow with the chunks, straight on the pool.
 */
public final class PrefillSends {
    private final SlotAllocator slots;
    private final KvPagePool pool;
    private final Map<Long, Send> sends = new HashMap<>();
    private final List<String> alarms = new ArrayList<>();
    private final int[] pages;
    private final long[] handles;

    /** One request's outgoing send: its claims in page-position order and the tokens handed over. */
    private static final class Send {
        final int tenant;
        final long peer;
        final long requestTokens;
        final long[] claims;
        int claimedPages;
        long sentTokens;
        boolean expired;

        Send(int tenant, long peer, long requestTokens, int pageCount) {
            this.tenant = tenant;
            this.peer = peer;
            this.requestTokens = requestTokens;
            this.claims = new long[pageCount];
        }
    }

    public PrefillSends(SlotAllocator slots) {
        this.slots = slots;
        this.pool = slots.pool();
        this.pages = new int[slots.pageCount()];
        this.handles = new long[slots.pageCount()];
    }

    /**
     * Starts a request's send to {@code peer} (an id the caller gives the bootstrap address).
     *
     * @throws dev.kvshield.admission.RequestTooLongException before anything is recorded
     * @throws IllegalStateException if the request already has a send here
     */
    public void begin(long request, int tenant, long requestTokens, long peer) {
        if (sends.containsKey(request)) {
            throw new IllegalStateException("request " + request + " already has an outgoing send");
        }
        pool.admit(requestTokens);
        int pageSize = slots.pageSizeTokens();
        sends.put(request, new Send(tenant, peer, requestTokens, (int) ((requestTokens + pageSize - 1) / pageSize)));
    }

    /**
     * Takes reader claims on the request's pages holding tokens {@code [0, endTokens)} that are not
     * claimed yet (the trailing partial page whole), all or nothing, before the transport reads them.
     *
     * @return pages newly claimed
     * @throws IllegalStateException if the send expired, or a page left the request (freed, or moved
     *     to the prefix cache): nothing is claimed
     * @throws IllegalArgumentException if {@code endTokens} is outside {@code [0, requestTokens]}
     * @throws dev.kvshield.claims.ClaimCapacityException if the pool has too few claim slots free
     */
    public int claim(long request, long endTokens) {
        Send s = send(request);
        if (s.expired) {
            throw new IllegalStateException("request " + request + ": its send expired; its claims are fenced");
        }
        if (endTokens < 0 || endTokens > s.requestTokens) {
            throw new IllegalArgumentException("request " + request + " sends tokens [0, " + endTokens + ") of " + s.requestTokens);
        }
        int pageSize = slots.pageSizeTokens();
        int to = (int) ((endTokens + pageSize - 1) / pageSize);
        int from = s.claimedPages;
        if (to <= from) {
            return 0;
        }
        if (slots.requestPages(request, from, to, pages) < 0) {
            throw new IllegalStateException("request " + request + " no longer owns every page at positions [" + from + ", " + to
                    + ") (freed, or held by the prefix cache); nothing claimed, nothing sent");
        }
        for (int i = 0; i < to - from; i++) {
            handles[i] = slots.handleOf(pages[i]);
            if (handles[i] == PageHandles.NONE) {
                throw new IllegalStateException("page " + pages[i] + " of request " + request + " is not owned now");
            }
        }
        pool.claimAll(s.tenant, Owners.request(request), handles, 0, to - from, ClaimKind.READER, s.peer, s.claims, from);
        s.claimedPages = to;
        return to - from;
    }

    /**
     * Records that the transport was handed tokens {@code [0, tokens)} (monotonic, within the claimed pages).
     *
     * @throws IllegalArgumentException naming the bounds otherwise
     */
    public void markSent(long request, long tokens) {
        Send s = send(request);
        long claimedTokens = Math.min(s.requestTokens, (long) s.claimedPages * slots.pageSizeTokens());
        if (tokens < s.sentTokens || tokens > claimedTokens) {
            throw new IllegalArgumentException("request " + request + ": sent tokens must grow within [" + s.sentTokens + ", "
                    + claimedTokens + "] (the claimed pages): " + tokens);
        }
        s.sentTokens = tokens;
    }

    /** Tokens handed to the transport so far. */
    public long sentTokens(long request) {
        return send(request).sentTokens;
    }

    /** Pages under the send's claims. */
    public int claimedPages(long request) {
        return send(request).claimedPages;
    }

    /** The transport concluded (succeeded or failed: it reads no more): every claim drops and the record goes. */
    public void complete(long request) {
        Send s = send(request);
        pool.dropClaims(s.claims, 0, s.claimedPages);
        sends.remove(request);
    }

    /**
     * The transport never concluded within its deadline: fences the claims (any later claimed read
     * fails), raises an alarm and keeps the pages claimed, so quarantined, until {@link #complete}.
     */
    public void expire(long request) {
        Send s = send(request);
        if (s.expired) {
            return;
        }
        for (int i = 0; i < s.claimedPages; i++) {
            pool.fenceClaim(s.claims[i]);
        }
        s.expired = true;
        alarms.add("prefill send alarm: transfer to peer " + s.peer + " for request " + request + " never concluded; "
                + s.claimedPages + " source pages stay quarantined until it does");
    }

    /** Whether {@code request} has a send here (begun, not completed). */
    public boolean has(long request) {
        return sends.containsKey(request);
    }

    /** Sends begun and not completed (expired ones included). */
    public int active() {
        return sends.size();
    }

    /** Alarms raised so far, one line each. */
    public String[] alarms() {
        return alarms.toArray(String[]::new);
    }

    private Send send(long request) {
        Send s = sends.get(request);
        if (s == null) {
            throw new IllegalStateException("request " + request + " has no outgoing send on this pool");
        }
        return s;
    }
}
