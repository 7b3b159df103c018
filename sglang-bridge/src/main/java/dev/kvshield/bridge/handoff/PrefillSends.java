package dev.kvshield.bridge.handoff;

import dev.kvshield.bridge.SlotAllocator;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.ForeignAccessException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The prefill side of SGLang's chunked KV sends on one bridged pool: reader claims on exactly the
 * pages each chunk hands the transport (host page ids, as SGLang passes them to its KV sender),
 * taken before the transport is handed the chunk and held until the transport's evidence that it no
 * longer reads ({@link #complete}). A claimed page released meanwhile (SGLang aborting the request,
 * the prefix cache evicting it, the request that computed a shared prefix finishing) stays
 * quarantined (never scrubbed, never handed out) until its claim drops, so the transport never reads
 * a page given to someone else.
 *
 * <ul>
 *   <li>{@link #begin}: admission first (an oversized request throws
 *       {@link dev.kvshield.admission.RequestTooLongException} and nothing is recorded), no claim yet.
 *   <li>{@link #claim}: reader claims on a chunk's pages, all or nothing. A page may be the
 *       request's own, another request's of its tenant (a prefix hit in SGLang's stock radix
 *       cache), its tenant's prefix-cache namespace's, or the operator's shared namespace's when the
 *       request's tenant is not regulated; any other page refuses the chunk. Each claim is taken in
 *       the name of the page's owner and audited with the send's peer. {@link #markSent} records
 *       what the transport was handed.
 *   <li>{@link #complete}: drops every claim (released pages are then protected and reused).
 *   <li>{@link #expire}: the transport never concluded: claims fenced, alarm raised, pages stay out
 *       of circulation (back-pressure) until a late {@link #complete}. A timeout is never a free.
 * </ul>
 *
 * <p>Every entry point refuses a request id the pool keeps for its own holders, or a negative one,
 * before anything changes ({@link SlotAllocator#requestHolder}).
 *
 * <p>Called from the scheduler thread only, like {@link SlotAllocator}; one call per chunk, not per
 * token.
 *
 * <p>Implementation notes: allocator-api's {@code HandoffSender} claims all of a request's pages at
 * its begin; SGLang's chunked prefill hands the transport each chunk as soon as it is computed,
 * before later chunks' pages exist, so the claims here grow with the chunks, straight on the pool.
 * Whom a page's claim is taken in the name of is the pool's answer: the page's earliest live owner,
 * cache-namespace or reservation lease ({@link dev.kvshield.pool.PoolView#primaryLeaseOf}); a page
 * with none (freed, evicted) is refused. A chunk over several holders takes one pool claim call per
 * run of pages of one holder; a failing run drops the runs before it, and the claims are dropped
 * and fenced in their holders' names.
 */
public final class PrefillSends {
    private final SlotAllocator slots;
    private final KvPagePool pool;
    private final Map<Long, Send> sends = new HashMap<>();
    private final List<String> alarms = new ArrayList<>();
    private final long[] proofs;
    private final long[] owners;
    private final int[] tenants;
    private final int[] pages;
    /** {@code batchMark[page] == batch} while {@code page} is in the chunk being claimed: duplicates within a chunk. */
    private final int[] batchMark;
    private int batch;

    /** One request's outgoing send: its claims, the pages under them and the tokens handed over. */
    private static final class Send {
        final int tenant;
        final long peer;
        final long requestTokens;
        final long[] claims;
        final int[] claimTenants;
        final long[] claimHolders;
        /** Open-addressed set of the claimed page ids ({@code -1}: empty), so no page is claimed twice. */
        final int[] claimed;
        int claimedPages;
        long sentTokens;
        boolean expired;

        Send(int tenant, long peer, long requestTokens, int pageCount) {
            this.tenant = tenant;
            this.peer = peer;
            this.requestTokens = requestTokens;
            this.claims = new long[pageCount];
            this.claimTenants = new int[pageCount];
            this.claimHolders = new long[pageCount];
            this.claimed = new int[Integer.highestOneBit(Math.max(1, pageCount) * 2) * 2];
            Arrays.fill(claimed, -1);
        }

        private int slotOf(int page) {
            int mask = claimed.length - 1;
            int i = (page * 0x9E3779B9) & mask;
            while (claimed[i] != -1 && claimed[i] != page) {
                i = (i + 1) & mask;
            }
            return i;
        }

        boolean holds(int page) {
            return claimed[slotOf(page)] == page;
        }

        void add(int page) {
            claimed[slotOf(page)] = page;
        }
    }

    public PrefillSends(SlotAllocator slots) {
        this.slots = slots;
        this.pool = slots.pool();
        int pageCount = slots.pageCount();
        this.proofs = new long[pageCount];
        this.owners = new long[pageCount];
        this.tenants = new int[pageCount];
        this.pages = new int[pageCount];
        this.batchMark = new int[pageCount];
    }

    /**
     * Starts a request's send to {@code peer} (an id the caller gives the bootstrap address).
     *
     * @throws dev.kvshield.admission.RequestTooLongException before anything is recorded
     * @throws IllegalArgumentException for a reserved or negative request id, before anything is recorded
     * @throws dev.kvshield.tenant.UnknownTenantException naming an unregistered tenant, before anything is recorded
     * @throws IllegalStateException if the request already has a send here
     */
    public void begin(long request, int tenant, long requestTokens, long peer) {
        SlotAllocator.requestHolder(request);
        pool.tenants().check(tenant);
        if (sends.containsKey(request)) {
            throw new IllegalStateException("request " + request + " already has an outgoing send");
        }
        pool.admit(requestTokens);
        int pageSize = slots.pageSizeTokens();
        sends.put(request, new Send(tenant, peer, requestTokens, (int) ((requestTokens + pageSize - 1) / pageSize)));
    }

    /**
     * Takes reader claims on the chunk's pages {@code chunkPages[0, count)} (the page ids SGLang
     * hands the transport) that this send has not claimed yet, all or nothing, before the transport
     * reads them. Every page must be allocated now and belong to the request's tenant, or to a shared
     * namespace when that tenant is not regulated; its owner may be any request of that tenant or a
     * namespace.
     *
     * @return pages newly claimed
     * @throws IllegalStateException if the send expired, or a page is not allocated now (freed,
     *     evicted): nothing is claimed
     * @throws ForeignAccessException naming the page, its tenant and the request, for a page of
     *     another tenant: nothing is claimed
     * @throws IllegalArgumentException for a page id outside the pool, a count outside
     *     {@code chunkPages}, or more pages than the request's tokens fill
     * @throws dev.kvshield.lease.LeaseCapacityException if the pool has too few claim slots free
     */
    public int claim(long request, int[] chunkPages, int count) {
        Send s = send(request);
        if (s.expired) {
            throw new IllegalStateException("request " + request + ": its send expired; its claims are fenced");
        }
        if (count < 0 || count > chunkPages.length) {
            throw new IllegalArgumentException("request " + request + " sends " + count + " pages of a " + chunkPages.length
                    + "-page array");
        }
        int n = collect(request, s, chunkPages, count);
        if (s.claimedPages + n > s.claims.length) {
            throw new IllegalArgumentException("request " + request + " of " + s.requestTokens + " tokens sends "
                    + (s.claimedPages + n) + " distinct pages; it fills " + s.claims.length + "; nothing claimed");
        }
        for (int i = 0; i < n; i++) {
            s.claimTenants[s.claimedPages + i] = tenants[i];
            s.claimHolders[s.claimedPages + i] = owners[i];
        }
        int taken = 0;
        try {
            while (taken < n) { // NOTE: one pool call per run of pages of the same holder
                int end = runEnd(tenants, owners, taken, n);
                pool.claim(tenants[taken], owners[taken], proofs, taken, end - taken, ClaimKind.READER, s.peer, s.claims,
                        s.claimedPages + taken);
                taken = end;
            }
        } catch (RuntimeException e) {
            // NOTE: all or nothing across the holders' runs
            forEachRun(s.claims, s.claimTenants, s.claimHolders, s.claimedPages, s.claimedPages + taken, true);
            throw e;
        }
        for (int i = 0; i < n; i++) {
            s.add(pages[i]);
        }
        s.claimedPages += n;
        return n;
    }

    /**
     * Checks every page of the chunk and gathers those new to this send into {@link #pages},
     * {@link #handles}, {@link #owners} and {@link #tenants}; changes nothing else.
     *
     * @return pages new to this send
     */
    private int collect(long request, Send s, int[] chunkPages, int count) {
        if (++batch == 0) {
            Arrays.fill(batchMark, 0);
            batch = 1;
        }
        int n = 0;
        for (int i = 0; i < count; i++) {
            int page = chunkPages[i];
            if (page < 0 || page >= batchMark.length) {
                throw new IllegalArgumentException("request " + request + " sends page " + page + " (index " + i
                        + "), outside the pool's " + batchMark.length + " pages; nothing claimed, nothing sent");
            }
            if (batchMark[page] == batch || s.holds(page)) {
                continue;
            }
            long proof = pool.view().primaryLeaseOf(page);
            int tenant = pool.view().tenantOfLease(proof);
            if (proof == LeaseIds.NONE || tenant < 0) {
                throw new IllegalStateException("request " + request + " sends page " + page + ", which is not allocated now "
                        + "(freed or evicted); nothing claimed, nothing sent");
            }
            if (tenant != s.tenant && !(pool.isSharedNamespace(tenant) && !pool.tenants().policy(s.tenant).regulated())) {
                throw new ForeignAccessException("request " + request + " of tenant " + s.tenant + " sends page " + page
                        + " of tenant " + tenant + (pool.isSharedNamespace(tenant) ? " (shared; a regulated tenant never sends "
                        + "shared pages)" : "") + "; nothing claimed, nothing sent");
            }
            batchMark[page] = batch;
            pages[n] = page;
            proofs[n] = proof;
            tenants[n] = tenant;
            owners[n] = pool.view().holderOf(proof);
            n++;
        }
        return n;
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
        forEachRun(s.claims, s.claimTenants, s.claimHolders, 0, s.claimedPages, true);
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
        forEachRun(s.claims, s.claimTenants, s.claimHolders, 0, s.claimedPages, false);
        s.expired = true;
        alarms.add("prefill send alarm: transfer to peer " + s.peer + " for request " + request + " never concluded; "
                + s.claimedPages + " source pages stay quarantined until it does");
    }

    /** The end of the run of entries from {@code from} (below {@code to}) with one (tenant, holder). */
    private static int runEnd(int[] runTenants, long[] holders, int from, int to) {
        int end = from + 1;
        while (end < to && runTenants[end] == runTenants[from] && holders[end] == holders[from]) {
            end++;
        }
        return end;
    }

    /** Drops ({@code drop}) or fences claims {@code [from, to)}, one pool call per run of one holder, in its name. */
    private void forEachRun(long[] claims, int[] claimTenants, long[] holders, int from, int to, boolean drop) {
        for (int i = from; i < to; ) {
            int end = runEnd(claimTenants, holders, i, to);
            if (drop) {
                pool.dropClaims(claimTenants[i], holders[i], claims, i, end - i);
            } else {
                pool.fenceClaims(claimTenants[i], holders[i], claims, i, end - i);
            }
            i = end;
        }
    }

    /** Whether {@code request} has a send here (begun, not completed). */
    public boolean has(long request) {
        SlotAllocator.requestHolder(request);
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

    /** The request's send; refuses a reserved or negative request id like every entry point. */
    private Send send(long request) {
        SlotAllocator.requestHolder(request);
        Send s = sends.get(request);
        if (s == null) {
            throw new IllegalStateException("request " + request + " has no outgoing send on this pool");
        }
        return s;
    }
}
