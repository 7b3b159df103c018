package dev.kvshield.lease;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.internal.Bits;
import dev.kvshield.internal.Digests;
import dev.kvshield.internal.IntStack;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.tenant.Owners;
import java.util.Arrays;

/**
 * Every hold on every page of one pool: lease records, the holds on each page, and the slots each
 * claim wrote. Checks a presented lease completely before the pool changes anything, and reports
 * each refusal (counted, emitted, thrown) with the values that disagree.
 *
 * <p>Not thread-safe: guarded by the pool lock. Used only by the pool (ModuleBoundariesTest keeps
 * it inside allocator-api). Minting, dropping and lookups do not allocate.
 *
 * <p>Implementation notes: records live in slots taken from a free-slot stack; each page's holds
 * form a doubly linked list through the slots. A lease id names its page ({@link LeaseIds}), so a
 * lookup walks only that page's holds (usually one or two) comparing ids; an id below the counter
 * that is not on its page's list was released. A claim's written slots live in a separate,
 * smaller table of bitsets, one row per claim.
 */
public final class LeaseTable {
    private static final int NIL = -1;
    /** The content kinds as a bit set of ordinals ({@link LeaseKind#holdsContent}), for hot paths. */
    private static final int CONTENT_KINDS = contentKinds();

    private final long[] ids;
    private final int[] page;
    private final int[] generation;
    private final int[] tenant;
    private final long[] holder;
    private final long[] peer;
    private final byte[] kind;
    private final boolean[] fenced;
    private final int[] claimRow;
    private final int[] next;
    private final int[] prev;
    private final int[] mark;
    private int stamp;
    private final int[] batchSlots;
    private int batchCount;
    private final int capacity;
    private final IntStack freeSlots;
    private final LeaseIds codec;

    private final int[] headByPage;
    private final int[] contentHolds;
    private final int[] claimHolds;

    private final long[] claimWritten;
    private final int wordsPerRow;
    private final IntStack freeClaimRows;
    private final int claimCapacity;

    private final PageEvents events;
    private long nextSerial;
    private int live;
    private int liveClaims;
    private int fencedClaims;
    private int claimedPages;

    /**
     * @param capacity most leases live at once
     * @param claimCapacity most claims live or fenced at once
     * @param slotsPerPage token slots per page (the width of a claim's written-slot bitset)
     * @param firstSerial the first serial minted (1 outside tests of exhaustion)
     */
    public LeaseTable(int pageCount, int capacity, int claimCapacity, int slotsPerPage, long firstSerial, PageEvents events) {
        codec = new LeaseIds(pageCount);
        if (capacity < 1 || capacity > 1 << 30 || claimCapacity < 0 || claimCapacity > capacity || firstSerial < 1
                || firstSerial > codec.maxSerial()) {
            throw new IllegalArgumentException("lease table needs 1 <= capacity <= 2^30, 0 <= claimCapacity <= capacity and"
                    + " 1 <= firstSerial <= " + codec.maxSerial() + ": capacity=" + capacity + " claimCapacity=" + claimCapacity
                    + " firstSerial=" + firstSerial);
        }
        this.capacity = capacity;
        freeSlots = new IntStack(capacity);
        for (int s = capacity - 1; s >= 0; s--) {
            freeSlots.push(s);
        }
        ids = new long[capacity];
        page = new int[capacity];
        generation = new int[capacity];
        tenant = new int[capacity];
        holder = new long[capacity];
        peer = new long[capacity];
        kind = new byte[capacity];
        fenced = new boolean[capacity];
        claimRow = new int[capacity];
        next = new int[capacity];
        prev = new int[capacity];
        mark = new int[capacity];
        batchSlots = new int[capacity];
        headByPage = new int[pageCount];
        Arrays.fill(headByPage, NIL);
        contentHolds = new int[pageCount];
        claimHolds = new int[pageCount];
        this.claimCapacity = claimCapacity;
        wordsPerRow = Bits.words(slotsPerPage);
        claimWritten = new long[claimCapacity * wordsPerRow];
        freeClaimRows = new IntStack(Math.max(claimCapacity, 1));
        for (int r = claimCapacity - 1; r >= 0; r--) {
            freeClaimRows.push(r);
        }
        nextSerial = firstSerial;
        this.events = events;
    }

    /** The codec of this table's ids. */
    public LeaseIds ids() {
        return codec;
    }

    // ---------------------------------------------------------------- checks (before any change)

    /**
     * The slot of {@code lease} if it is live and minted to {@code (tenantId, holderRef)}, of a kind
     * {@code accept} takes; otherwise reports the refusal and throws it.
     *
     * @param accept kinds the call takes, as a bit set of {@link LeaseKind} ordinals
     * @param what the call, for messages ("release", "write", ...)
     */
    public int checkHeld(long lease, int tenantId, long holderRef, int accept, String what) {
        int s = checkLive(lease, tenantId, holderRef);
        if (tenant[s] != tenantId || holder[s] != holderRef) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page[s], generation[s], tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, what + ": lease " + lease + " on page " + page[s] + " is held by tenant "
                            + tenant[s] + " " + Owners.describe(holder[s]) + ", not by tenant " + tenantId + " "
                            + Owners.describe(holderRef)));
        }
        if (fenced[s]) {
            throw events.reject(Rejection.REVOKED_CLAIM, PageEventType.REJECT_REVOKED_CLAIM, page[s], generation[s], tenantId,
                    holderRef, lease, new FencedLeaseException(lease, what + ": claim " + lease + " on page " + page[s]
                            + " was fenced (its transfer expired); it must not touch the page"));
        }
        if ((accept & (1 << kind[s])) == 0) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page[s], generation[s], tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, what + ": lease " + lease + " on page " + page[s] + " is a " + kindOf(s)
                            + " lease; " + what + " takes " + describeKinds(accept)));
        }
        return s;
    }

    /** Like {@link #checkHeld} for dropping claims: fenced claims are accepted (dropping is how they end). */
    public int checkClaim(long lease, int tenantId, long holderRef) {
        int s = checkLive(lease, tenantId, holderRef);
        if (tenant[s] != tenantId || holder[s] != holderRef || kindOf(s).holdsContent()) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page[s], generation[s], tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, "lease " + lease + " on page " + page[s] + " is a " + kindOf(s)
                            + " lease of tenant " + tenant[s] + " " + Owners.describe(holder[s]) + "; expected a claim of tenant "
                            + tenantId + " " + Owners.describe(holderRef)));
        }
        return s;
    }

    private int checkLive(long lease, int tenantId, long holderRef) {
        if (!codec.isWellFormed(lease) || codec.serial(lease) >= nextSerial) {
            throw events.reject(Rejection.INVALID, PageEventType.REJECT_STALE, -1, 0, tenantId, holderRef, lease,
                    new UnknownLeaseException(lease, codec.describe(lease) + " was never minted by this pool (next serial "
                            + nextSerial + ")"));
        }
        int s = find(lease);
        if (s < 0) {
            int p = codec.page(lease);
            throw events.reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, p, 0, tenantId, holderRef, lease,
                    new ReleasedLeaseException(lease, "lease " + lease + " on page " + p + " is not held: it was released or"
                            + " presented already (ids are never reused)"));
        }
        return s;
    }

    private int find(long lease) {
        for (int s = headByPage[codec.page(lease)]; s != NIL; s = next[s]) {
            if (ids[s] == lease) {
                return s;
            }
        }
        return NIL;
    }

    /**
     * Starts a batch's check: {@link #markOnce} refuses a lease listed twice in it and remembers each
     * checked lease's slot in order ({@link #batchSlot}), so applying the batch looks nothing up again.
     */
    public void beginBatch() {
        if (++stamp == Integer.MAX_VALUE) {
            Arrays.fill(mark, 0);
            stamp = 1;
        }
        batchCount = 0;
    }

    /** The slot of the {@code i}-th lease {@link #markOnce} accepted since {@link #beginBatch}. */
    public int batchSlot(int i) {
        return batchSlots[i];
    }

    public void markOnce(int slot, String what) {
        if (mark[slot] == stamp) {
            long lease = ids[slot];
            throw events.reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page[slot], generation[slot], tenant[slot],
                    holder[slot], lease, new DuplicateLeaseException(lease, what + ": lease " + lease + " on page " + page[slot]
                            + " is listed twice in one call"));
        }
        mark[slot] = stamp;
        batchSlots[batchCount++] = slot;
    }

    /**
     * Refuses a batch that would mint {@code leases} leases, {@code claims} of them claims, before
     * anything changes: the table full, the claim table full, or the id counter near its end.
     */
    public void checkRoom(int leases, int claims) {
        if ((long) live + leases > capacity) {
            throw new LeaseCapacityException(leases + " leases asked for, " + (capacity - live) + " of " + capacity
                    + " free; raise maxLeases");
        }
        if ((long) liveClaims + fencedClaims + claims > claimCapacity) {
            throw new LeaseCapacityException(claims + " claims asked for, " + (claimCapacity - liveClaims - fencedClaims) + " of "
                    + claimCapacity + " free; raise maxClaims");
        }
        if (nextSerial > codec.maxSerial() - leases + 1) {
            throw new LeaseIdsExhaustedException("lease ids exhausted: " + leases + " leases asked for, next serial " + nextSerial
                    + ", largest " + codec.maxSerial() + " (" + (63 - codec.pageBits()) + " serial bits); this pool mints no more"
                    + " holds (ids never wrap)");
        }
    }

    // ---------------------------------------------------------------- changes (after the checks)

    /** Mints a lease; {@link #checkRoom} must have passed for it. Returns the id. */
    public long mint(int pageIndex, int pageGeneration, int tenantId, long holderRef, LeaseKind leaseKind, long peerRef) {
        long id = codec.encode(nextSerial++, pageIndex);
        int s = freeSlots.pop();
        ids[s] = id;
        page[s] = pageIndex;
        generation[s] = pageGeneration;
        tenant[s] = tenantId;
        holder[s] = holderRef;
        peer[s] = peerRef;
        kind[s] = (byte) leaseKind.ordinal();
        fenced[s] = false;
        int head = headByPage[pageIndex];
        prev[s] = NIL;
        next[s] = head;
        if (head != NIL) {
            prev[head] = s;
        }
        headByPage[pageIndex] = s;
        live++;
        if (leaseKind.holdsContent()) {
            contentHolds[pageIndex]++;
            claimRow[s] = NIL;
        } else {
            if (claimHolds[pageIndex]++ == 0) {
                claimedPages++;
            }
            liveClaims++;
            int row = freeClaimRows.pop();
            claimRow[s] = row;
            Bits.clear(claimWritten, row * wordsPerRow, wordsPerRow);
        }
        return id;
    }

    /**
     * Hands the content hold in slot {@code s} over in place: the slot gets a new id (a fresh serial;
     * the old id is dead, never reused) for {@code holderRef} with {@code leaseKind}, a content kind,
     * keeping its page, generation and tenant; the page's count of content holds is unchanged. For a
     * transfer, after its checks ({@link #checkRoom} passed for one lease per hold, as for a mint
     * followed by a drop). Returns the new id.
     */
    public long remint(int s, long holderRef, LeaseKind leaseKind) {
        if (!leaseKind.holdsContent() || (CONTENT_KINDS >>> kind[s] & 1) == 0) {
            throw new IllegalStateException("remint of a " + kindOf(s) + " lease as " + leaseKind + ": content holds only");
        }
        long id = codec.encode(nextSerial++, page[s]);
        ids[s] = id;
        holder[s] = holderRef;
        peer[s] = 0;
        kind[s] = (byte) leaseKind.ordinal();
        return id;
    }

    /**
     * Ends the hold in slot {@code s}.
     *
     * @return the page's remaining holds of the same sort: content holds for a content lease,
     *     claims for a claim
     */
    public int drop(int s) {
        int p = page[s];
        if (prev[s] != NIL) {
            next[prev[s]] = next[s];
        } else {
            headByPage[p] = next[s];
        }
        if (next[s] != NIL) {
            prev[next[s]] = prev[s];
        }
        ids[s] = 0;
        freeSlots.push(s);
        live--;
        if ((CONTENT_KINDS >>> kind[s] & 1) != 0) {
            return --contentHolds[p];
        }
        if (fenced[s]) {
            fencedClaims--;
        } else {
            liveClaims--;
        }
        freeClaimRows.push(claimRow[s]);
        if (--claimHolds[p] == 0) {
            claimedPages--;
        }
        return claimHolds[p];
    }

    /** Fences a live claim: every later use fails; it still holds the page until dropped. */
    public boolean fence(int s) {
        if (fenced[s]) {
            return false;
        }
        fenced[s] = true;
        liveClaims--;
        fencedClaims++;
        return true;
    }

    public void markClaimWritten(int s, int fromSlot, int toSlot) {
        Bits.set(claimWritten, claimRow[s] * wordsPerRow, fromSlot, toSlot);
    }

    public boolean claimWrote(int s, int fromSlot, int toSlot) {
        return Bits.allSet(claimWritten, claimRow[s] * wordsPerRow, fromSlot, toSlot);
    }

    // ---------------------------------------------------------------- reads

    /** The slot of a live lease, or -1 (never throws, reports nothing). */
    public int slotOf(long lease) {
        return codec.isWellFormed(lease) ? find(lease) : NIL;
    }

    /** The live lease {@code (tenantId, holderRef)} holds on {@code pageIndex} with {@code leaseKind}, or {@link LeaseIds#NONE}. */
    public long find(int pageIndex, int tenantId, long holderRef, LeaseKind leaseKind) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next[s]) {
            if (holder[s] == holderRef && tenant[s] == tenantId && kind[s] == leaseKind.ordinal()) {
                return ids[s];
            }
        }
        return LeaseIds.NONE;
    }

    /** Whether {@code (tenantId, holderRef)} holds a content lease on {@code pageIndex}. */
    public boolean holdsContent(int pageIndex, int tenantId, long holderRef) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next[s]) {
            if (holder[s] == holderRef && tenant[s] == tenantId && LeaseKind.ofOrdinal(kind[s]).holdsContent()) {
                return true;
            }
        }
        return false;
    }

    /** The slot of a live (unfenced) writer claim {@code (tenantId, holderRef)} holds on {@code pageIndex}, or -1. */
    public int writerClaimOf(int pageIndex, int tenantId, long holderRef) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next[s]) {
            if (holder[s] == holderRef && tenant[s] == tenantId && kind[s] == LeaseKind.CLAIM_WRITER.ordinal() && !fenced[s]) {
                return s;
            }
        }
        return NIL;
    }

    /** The earliest-minted live lease on {@code pageIndex} of a kind in {@code accept} (a {@link #kinds} set), or {@link LeaseIds#NONE}. */
    public long firstOf(int pageIndex, int accept) {
        long first = LeaseIds.NONE;
        for (int s = headByPage[pageIndex]; s != NIL; s = next[s]) {
            if ((accept & (1 << kind[s])) != 0 && (first == LeaseIds.NONE || ids[s] < first)) {
                first = ids[s];
            }
        }
        return first;
    }

    public long id(int s) {
        return ids[s];
    }

    public int page(int s) {
        return page[s];
    }

    public int generation(int s) {
        return generation[s];
    }

    public int tenant(int s) {
        return tenant[s];
    }

    public long holder(int s) {
        return holder[s];
    }

    public long peer(int s) {
        return peer[s];
    }

    public LeaseKind kindOf(int s) {
        return LeaseKind.ofOrdinal(kind[s]);
    }

    public ClaimKind claimKind(int s) {
        return kind[s] == LeaseKind.CLAIM_WRITER.ordinal() ? ClaimKind.WRITER : ClaimKind.READER;
    }

    public boolean isFenced(int s) {
        return fenced[s];
    }

    public int contentHolds(int pageIndex) {
        return contentHolds[pageIndex];
    }

    public int claimHolds(int pageIndex) {
        return claimHolds[pageIndex];
    }

    public int live() {
        return live;
    }

    public int liveClaims() {
        return liveClaims;
    }

    public int fencedClaims() {
        return fencedClaims;
    }

    /** Pages with at least one claim, live or fenced. */
    public int claimedPages() {
        return claimedPages;
    }

    public int capacity() {
        return capacity;
    }

    public long nextSerial() {
        return nextSerial;
    }

    /** Mixes every live lease (id, page, generation, tenant, holder, kind, fence, claim slots) and the counter into {@code h}. */
    public long digest(long h) {
        for (int s = 0; s < ids.length; s++) {
            if (ids[s] != 0) {
                h = Digests.mix(h, ids[s]);
                h = Digests.mix(h, page[s]);
                h = Digests.mix(h, generation[s]);
                h = Digests.mix(h, tenant[s]);
                h = Digests.mix(h, holder[s]);
                h = Digests.mix(h, kind[s] * 2L + (fenced[s] ? 1 : 0));
                if (claimRow[s] != NIL) {
                    for (int w = 0; w < wordsPerRow; w++) {
                        h = Digests.mix(h, claimWritten[claimRow[s] * wordsPerRow + w]);
                    }
                }
            }
        }
        return Digests.mix(h, nextSerial);
    }

    private static String describeKinds(int accept) {
        StringBuilder b = new StringBuilder();
        for (LeaseKind k : LeaseKind.values()) {
            if ((accept & (1 << k.ordinal())) != 0) {
                b.append(b.isEmpty() ? "" : "/").append(k);
            }
        }
        return b.toString();
    }

    private static int contentKinds() {
        int bits = 0;
        for (LeaseKind k : LeaseKind.values()) {
            bits |= k.holdsContent() ? 1 << k.ordinal() : 0;
        }
        return bits;
    }

    /** A bit set of kinds, for {@link #checkHeld}'s {@code accept}. */
    public static int kinds(LeaseKind... kinds) {
        int bits = 0;
        for (LeaseKind k : kinds) {
            bits |= 1 << k.ordinal();
        }
        return bits;
    }
}
