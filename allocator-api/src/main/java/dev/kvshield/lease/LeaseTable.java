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
    /**
     * Most leases one table holds: its records live in one {@code long[]} of 8 longs per record, and
     * a Java array stays below 2^31 elements (the JVM keeps a few for its header), so 2^28 less a margin.
     */
    public static final int MAX_CAPACITY = (1 << 28) - 16;
    private static final int NIL = -1;
    /** The content kinds as a bit set of ordinals ({@link LeaseKind#holdsContent}), for hot paths. */
    private static final int CONTENT_KINDS = contentKinds();

    // One record of REC longs per slot, so a lookup touches one or two cache lines instead of one per field.
    private static final int REC_SHIFT = 3;
    private static final int ID = 0;
    private static final int HOLDER = 1;
    private static final int PAGE_GENERATION = 2; // page low 32 bits, generation high
    private static final int TENANT_ROW = 3; // tenant low, claim row high
    private static final int LINKS = 4; // next low, prev high
    private static final int KIND_MARK = 5; // kind bits 0-7, fenced bit 8, batch mark high 32 bits
    private static final int PEER = 6;
    private static final long LOW = 0xFFFF_FFFFL;
    private static final long FENCED = 1L << 8;
    private final long[] rec;
    private int stamp;
    private final int[] batchSlots;
    private int batchCount;
    /** What {@link #markedSole} answers. */
    private boolean markedSole;
    /** The slots of a run {@link #mintAll} mints (a hand-out's, at most one lease per page). */
    private final int[] runSlots;
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
        if (capacity < 1 || capacity > MAX_CAPACITY || claimCapacity < 0 || claimCapacity > capacity || firstSerial < 1
                || firstSerial > codec.maxSerial()) {
            throw new IllegalArgumentException("lease table needs 1 <= capacity <= " + MAX_CAPACITY + ", 0 <= claimCapacity <= capacity and"
                    + " 1 <= firstSerial <= " + codec.maxSerial() + ": capacity=" + capacity + " claimCapacity=" + claimCapacity
                    + " firstSerial=" + firstSerial);
        }
        this.capacity = capacity;
        freeSlots = new IntStack(capacity);
        for (int s = capacity - 1; s >= 0; s--) {
            freeSlots.push(s);
        }
        rec = new long[capacity << REC_SHIFT];
        batchSlots = new int[capacity];
        runSlots = new int[pageCount];
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
        if (tenant(s) != tenantId || holder(s) != holderRef) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page(s), generation(s), tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, what + ": lease " + lease + " on page " + page(s) + " is held by tenant "
                            + tenant(s) + " " + Owners.describe(holder(s)) + ", not by tenant " + tenantId + " "
                            + Owners.describe(holderRef)));
        }
        if (isFenced(s)) {
            throw events.reject(Rejection.REVOKED_CLAIM, PageEventType.REJECT_REVOKED_CLAIM, page(s), generation(s), tenantId,
                    holderRef, lease, new FencedLeaseException(lease, what + ": claim " + lease + " on page " + page(s)
                            + " was fenced (its transfer expired); it must not touch the page"));
        }
        if ((accept & (1 << kindOrdinal(s))) == 0) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page(s), generation(s), tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, what + ": lease " + lease + " on page " + page(s) + " is a " + kindOf(s)
                            + " lease; " + what + " takes " + describeKinds(accept)));
        }
        return s;
    }

    /** Like {@link #checkHeld} for dropping claims: fenced claims are accepted (dropping is how they end). */
    public int checkClaim(long lease, int tenantId, long holderRef) {
        int s = checkLive(lease, tenantId, holderRef);
        if (tenant(s) != tenantId || holder(s) != holderRef || kindOf(s).holdsContent()) {
            throw events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page(s), generation(s), tenantId, holderRef, lease,
                    new ForeignLeaseException(lease, "lease " + lease + " on page " + page(s) + " is a " + kindOf(s)
                            + " lease of tenant " + tenant(s) + " " + Owners.describe(holder(s)) + "; expected a claim of tenant "
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
        for (int s = headByPage[codec.page(lease)]; s != NIL; s = next(s)) {
            if (id(s) == lease) {
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
            for (int b = KIND_MARK; b < rec.length; b += 1 << REC_SHIFT) {
                rec[b] &= LOW;
            }
            stamp = 1;
        }
        batchCount = 0;
    }

    /** The slot of the {@code i}-th lease {@link #markOnce} accepted since {@link #beginBatch}. */
    public int batchSlot(int i) {
        return batchSlots[i];
    }

    public void markOnce(int slot, String what) {
        int b = (slot << REC_SHIFT) + KIND_MARK;
        if ((int) (rec[b] >>> 32) == stamp) {
            throw listedTwice(slot, what);
        }
        rec[b] = (rec[b] & LOW) | ((long) stamp << 32);
        batchSlots[batchCount++] = slot;
    }

    /** Reports the lease in {@code slot}, listed twice in one call, and returns the refusal to throw. */
    private DuplicateLeaseException listedTwice(int slot, String what) {
        long lease = id(slot);
        return events.reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page(slot), generation(slot), tenant(slot),
                holder(slot), lease, new DuplicateLeaseException(lease, what + ": lease " + lease + " on page " + page(slot)
                        + " is listed twice in one call"));
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
        writeRecord(s, id, pageIndex, pageGeneration, tenantId, holderRef, leaseKind.ordinal(), peerRef);
        live++;
        if (leaseKind.holdsContent()) {
            contentHolds[pageIndex]++;
        } else {
            addClaim(s, pageIndex, tenantId);
        }
        return id;
    }

    /**
     * {@link #mint} of a content lease of {@code kind} for {@code (tenantId, holderRef)} on each page of {@code pages[from,
     * from + count)} at {@code generations[from + i]}, in order, the ids to {@code idsOut[outOffset + i]}: a hand-out's
     * run of pages. {@link #checkRoom} must have passed for them.
     *
     * <p>Implementation notes: the run's slots are taken at once and the serial kept in a local, the counters stored once.
     */
    public void mintAll(int[] pages, int[] generations, int from, int count, int tenantId, long holderRef, LeaseKind leaseKind,
            long[] idsOut, int outOffset) {
        if (!leaseKind.holdsContent()) {
            throw new IllegalStateException("a run of " + leaseKind + " leases: content holds only (claims are minted one by one)");
        }
        long serial = nextSerial;
        int kind = leaseKind.ordinal();
        freeSlots.popInto(count, runSlots, 0);
        for (int i = 0; i < count; i++) {
            int pageIndex = pages[from + i];
            long id = codec.encode(serial++, pageIndex);
            writeRecord(runSlots[i], id, pageIndex, generations[from + i], tenantId, holderRef, kind, 0);
            contentHolds[pageIndex]++;
            idsOut[outOffset + i] = id;
        }
        nextSerial = serial;
        live += count;
    }

    /**
     * Writes a new lease's record into the free slot {@code s} (no claim row, no batch mark) and links it first among its
     * page's holds.
     */
    private void writeRecord(int s, long id, int pageIndex, int pageGeneration, int tenantId, long holderRef, int kindOrdinal,
            long peerRef) {
        int b = s << REC_SHIFT;
        int head = headByPage[pageIndex];
        rec[b + ID] = id;
        rec[b + HOLDER] = holderRef;
        rec[b + PAGE_GENERATION] = (pageIndex & LOW) | ((long) pageGeneration << 32);
        rec[b + TENANT_ROW] = (tenantId & LOW) | ((long) NIL << 32);
        rec[b + LINKS] = (head & LOW) | ((long) NIL << 32);
        rec[b + KIND_MARK] = kindOrdinal; // NOTE: a mark of 0 is no batch's (stamps start at 1)
        rec[b + PEER] = peerRef;
        if (head != NIL) {
            setPrev(head, s);
        }
        headByPage[pageIndex] = s;
    }

    /**
     * The claim bookkeeping of the claim just minted in slot {@code s}: its page's claim count and a cleared row of
     * written slots. Implementation notes: out of {@link #mint}, so hand-outs (content holds only) mint through a
     * method small enough to be inlined into their per-page loop.
     */
    private void addClaim(int s, int pageIndex, int tenantId) {
        if (claimHolds[pageIndex]++ == 0) {
            claimedPages++;
        }
        liveClaims++;
        int row = freeClaimRows.pop();
        rec[(s << REC_SHIFT) + TENANT_ROW] = (tenantId & LOW) | ((long) row << 32);
        Bits.clear(claimWritten, row * wordsPerRow, wordsPerRow);
    }

    /**
     * Hands the content hold in slot {@code s} over in place: the slot gets a new id (a fresh serial;
     * the old id is dead, never reused) for {@code holderRef} with {@code leaseKind}, a content kind,
     * keeping its page, generation and tenant; the page's count of content holds is unchanged. For a
     * transfer, after its checks ({@link #checkRoom} passed for one lease per hold, as for a mint
     * followed by a drop). Returns the new id.
     */
    public long remint(int s, long holderRef, LeaseKind leaseKind) {
        int b = s << REC_SHIFT;
        if (!leaseKind.holdsContent() || (CONTENT_KINDS >>> kindOrdinal(s) & 1) == 0) {
            throw new IllegalStateException("remint of a " + kindOf(s) + " lease as " + leaseKind + ": content holds only");
        }
        long id = codec.encode(nextSerial++, page(s));
        rec[b + ID] = id;
        rec[b + HOLDER] = holderRef;
        rec[b + PEER] = 0;
        rec[b + KIND_MARK] = (rec[b + KIND_MARK] & ~0xFFL) | leaseKind.ordinal(); // content holds are never fenced
        return id;
    }

    /**
     * Ends the hold in slot {@code s}.
     *
     * @return the page's remaining holds of the same sort: content holds for a content lease,
     *     claims for a claim
     */
    public int drop(int s) {
        int p = page(s);
        int prevSlot = prev(s);
        int nextSlot = next(s);
        if (prevSlot != NIL) {
            setNext(prevSlot, nextSlot);
        } else {
            headByPage[p] = nextSlot;
        }
        if (nextSlot != NIL) {
            setPrev(nextSlot, prevSlot);
        }
        rec[(s << REC_SHIFT) + ID] = 0;
        freeSlots.push(s);
        live--;
        if ((CONTENT_KINDS >>> kindOrdinal(s) & 1) != 0) {
            return --contentHolds[p];
        }
        return dropClaim(s, p);
    }

    /** The claim bookkeeping of {@link #drop} for the claim in slot {@code s} on page {@code p}; returns the page's claims left. */
    private int dropClaim(int s, int p) {
        if (isFenced(s)) {
            fencedClaims--;
        } else {
            liveClaims--;
        }
        freeClaimRows.push(claimRow(s));
        if (--claimHolds[p] == 0) {
            claimedPages--;
        }
        return claimHolds[p];
    }

    /** The pages of the {@code count} leases of the checked batch ({@link #markOnce} since {@link #beginBatch}), in order. */
    public void batchPages(int count, int[] pagesOut) {
        for (int i = 0; i < count; i++) {
            pagesOut[i] = page(batchSlots[i]);
        }
    }

    /**
     * Whether each page of {@code pages[offset, offset + count)} has exactly one hold, a content hold. Where the checked
     * batch's {@code i}-th lease is a content hold on {@code pages[offset + i]}, each is then its page's only hold, no two
     * are on one page, and ending them ({@link #dropSoleHolds}) ends every page's last hold.
     */
    public boolean soleHolds(int[] pages, int offset, int count) {
        for (int i = offset; i < offset + count; i++) {
            if (contentHolds[pages[i]] != 1 || claimHolds[pages[i]] != 0) {
                return false;
            }
        }
        return true;
    }

    /**
     * Ends the {@code count} holds of the checked batch, in order, as {@link #drop} of each would, where the {@code i}-th is
     * the only hold on {@code pages[offset + i]} ({@link #soleHolds} said so): each page's list of holds becomes empty.
     */
    public void dropSoleHolds(int[] pages, int offset, int count) {
        for (int i = 0; i < count; i++) {
            int p = pages[offset + i];
            headByPage[p] = NIL;
            contentHolds[p] = 0;
            rec[(batchSlots[i] << REC_SHIFT) + ID] = 0;
        }
        freeSlots.pushAll(batchSlots, 0, count);
        live -= count;
    }

    /** Fences a live claim: every later use fails; it still holds the page until dropped. */
    public boolean fence(int s) {
        if (isFenced(s)) {
            return false;
        }
        rec[(s << REC_SHIFT) + KIND_MARK] |= FENCED;
        liveClaims--;
        fencedClaims++;
        return true;
    }

    public void markClaimWritten(int s, int fromSlot, int toSlot) {
        Bits.set(claimWritten, claimRow(s) * wordsPerRow, fromSlot, toSlot);
    }

    public boolean claimWrote(int s, int fromSlot, int toSlot) {
        return Bits.allSet(claimWritten, claimRow(s) * wordsPerRow, fromSlot, toSlot);
    }

    // ---------------------------------------------------------------- reads

    /** The slot of a live lease, or -1 (never throws, reports nothing). */
    public int slotOf(long lease) {
        return codec.isWellFormed(lease) ? find(lease) : NIL;
    }

    /** The live lease {@code (tenantId, holderRef)} holds on {@code pageIndex} with {@code leaseKind}, or {@link LeaseIds#NONE}. */
    public long find(int pageIndex, int tenantId, long holderRef, LeaseKind leaseKind) {
        int s = slotHeld(pageIndex, tenantId, holderRef, leaseKind);
        return s == NIL ? LeaseIds.NONE : id(s);
    }

    /** The slot of the live lease {@code (tenantId, holderRef)} holds on {@code pageIndex} with {@code leaseKind}, or -1. */
    public int slotHeld(int pageIndex, int tenantId, long holderRef, LeaseKind leaseKind) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next(s)) {
            if (holder(s) == holderRef && tenant(s) == tenantId && kindOrdinal(s) == leaseKind.ordinal()) {
                return s;
            }
        }
        return NIL;
    }

    /**
     * For each page of {@code pages[offset, offset + count)} in order, while {@code (tenantId, holderRef)} holds it with
     * {@code leaseKind}: the lease to {@code leasesOut[outOffset + i]}, then {@link #markOnce} (a lease listed twice is
     * refused as there). Stops at the first page not so held (one outside the table's pages included), nothing written
     * or marked for it. {@link #markedSole} then says whether each lease it marked is its page's only hold.
     *
     * @return how many pages from the first were held
     */
    public int markHeldPages(int[] pages, int offset, int count, int tenantId, long holderRef, LeaseKind leaseKind, String what,
            long[] leasesOut, int outOffset) {
        boolean sole = true;
        for (int i = 0; i < count; i++) {
            int page = pages[offset + i];
            int s = page >= 0 && page < headByPage.length ? slotHeld(page, tenantId, holderRef, leaseKind) : NIL;
            if (s == NIL) {
                markedSole = sole;
                return i;
            }
            sole &= headByPage[page] == s && next(s) == NIL; // NOTE: the lookup's list walk already read both
            leasesOut[outOffset + i] = id(s);
            markOnce(s, what);
        }
        markedSole = sole;
        return count;
    }

    /**
     * Whether each lease the last {@link #markHeldPages} marked is the only hold of any kind on its page: for leases of a
     * content kind, what {@link #soleHolds} says of their pages.
     */
    public boolean markedSole() {
        return markedSole;
    }

    /** Whether {@code (tenantId, holderRef)} holds a content lease on {@code pageIndex}. */
    public boolean holdsContent(int pageIndex, int tenantId, long holderRef) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next(s)) {
            if (holder(s) == holderRef && tenant(s) == tenantId && LeaseKind.ofOrdinal(kindOrdinal(s)).holdsContent()) {
                return true;
            }
        }
        return false;
    }

    /** The slot of a live (unfenced) writer claim {@code (tenantId, holderRef)} holds on {@code pageIndex}, or -1. */
    public int writerClaimOf(int pageIndex, int tenantId, long holderRef) {
        for (int s = headByPage[pageIndex]; s != NIL; s = next(s)) {
            if (holder(s) == holderRef && tenant(s) == tenantId && kindOrdinal(s) == LeaseKind.CLAIM_WRITER.ordinal() && !isFenced(s)) {
                return s;
            }
        }
        return NIL;
    }

    /** The earliest-minted live lease on {@code pageIndex} of a kind in {@code accept} (a {@link #kinds} set), or {@link LeaseIds#NONE}. */
    public long firstOf(int pageIndex, int accept) {
        long first = LeaseIds.NONE;
        for (int s = headByPage[pageIndex]; s != NIL; s = next(s)) {
            if ((accept & (1 << kindOrdinal(s))) != 0 && (first == LeaseIds.NONE || id(s) < first)) {
                first = id(s);
            }
        }
        return first;
    }

    public long id(int s) {
        return rec[(s << REC_SHIFT) + ID];
    }

    public int page(int s) {
        return (int) rec[(s << REC_SHIFT) + PAGE_GENERATION];
    }

    public int generation(int s) {
        return (int) (rec[(s << REC_SHIFT) + PAGE_GENERATION] >>> 32);
    }

    public int tenant(int s) {
        return (int) rec[(s << REC_SHIFT) + TENANT_ROW];
    }

    public long holder(int s) {
        return rec[(s << REC_SHIFT) + HOLDER];
    }

    public long peer(int s) {
        return rec[(s << REC_SHIFT) + PEER];
    }

    private int claimRow(int s) {
        return (int) (rec[(s << REC_SHIFT) + TENANT_ROW] >>> 32);
    }

    private int next(int s) {
        return (int) rec[(s << REC_SHIFT) + LINKS];
    }

    private int prev(int s) {
        return (int) (rec[(s << REC_SHIFT) + LINKS] >>> 32);
    }

    private void setNext(int s, int nextSlot) {
        int b = (s << REC_SHIFT) + LINKS;
        rec[b] = (rec[b] & ~LOW) | (nextSlot & LOW);
    }

    private void setPrev(int s, int prevSlot) {
        int b = (s << REC_SHIFT) + LINKS;
        rec[b] = (rec[b] & LOW) | ((long) prevSlot << 32);
    }

    private int kindOrdinal(int s) {
        return (int) rec[(s << REC_SHIFT) + KIND_MARK] & 0xFF;
    }

    public LeaseKind kindOf(int s) {
        return LeaseKind.ofOrdinal(kindOrdinal(s));
    }

    public ClaimKind claimKind(int s) {
        return kindOrdinal(s) == LeaseKind.CLAIM_WRITER.ordinal() ? ClaimKind.WRITER : ClaimKind.READER;
    }

    public boolean isFenced(int s) {
        return (rec[(s << REC_SHIFT) + KIND_MARK] & FENCED) != 0;
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
        for (int s = 0; s < capacity; s++) {
            if (id(s) != 0) {
                h = Digests.mix(h, id(s));
                h = Digests.mix(h, page(s));
                h = Digests.mix(h, generation(s));
                h = Digests.mix(h, tenant(s));
                h = Digests.mix(h, holder(s));
                h = Digests.mix(h, kindOrdinal(s) * 2L + (isFenced(s) ? 1 : 0));
                if (claimRow(s) != NIL) {
                    for (int w = 0; w < wordsPerRow; w++) {
                        h = Digests.mix(h, claimWritten[claimRow(s) * wordsPerRow + w]);
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
