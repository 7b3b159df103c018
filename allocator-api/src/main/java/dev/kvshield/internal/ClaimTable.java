package dev.kvshield.internal;

import dev.kvshield.claims.ClaimCapacityException;
import dev.kvshield.claims.ClaimIds;
import dev.kvshield.claims.ClaimKind;

/**
 * Claim slots in preallocated arrays; a claim id is slot plus slot generation
 * ({@link ClaimIds}). Not thread-safe (guarded by the pool lock).
 */
public final class ClaimTable {
    public static final byte FREE = 0;
    public static final byte LIVE = 1;
    public static final byte REVOKED = 2;
    private static final ClaimKind[] KINDS = ClaimKind.values();

    private final int[] page;
    private final int[] pageGeneration;
    private final int[] slotGeneration;
    private final byte[] state;
    private final byte[] kind;
    private final int[] tenant;
    private final long[] owner;
    private final long[] peer;
    private final long[] writtenSlots;
    private final int wordsPerPage;
    private final IntStack freeSlots;
    private int live;
    private int revoked;

    public ClaimTable(int capacity, int wordsPerPage) {
        page = new int[capacity];
        pageGeneration = new int[capacity];
        slotGeneration = new int[capacity];
        java.util.Arrays.fill(slotGeneration, 1);
        state = new byte[capacity];
        kind = new byte[capacity];
        tenant = new int[capacity];
        owner = new long[capacity];
        peer = new long[capacity];
        this.wordsPerPage = wordsPerPage;
        writtenSlots = new long[capacity * wordsPerPage];
        freeSlots = new IntStack(capacity);
        for (int i = capacity - 1; i >= 0; i--) {
            freeSlots.push(i);
        }
    }

    /** The slot of a live or revoked claim, or -1 if the id names none. */
    public int slotOf(long claimId) {
        if (!ClaimIds.isWellFormed(claimId)) {
            return -1;
        }
        int slot = ClaimIds.slot(claimId);
        if (slot >= state.length || state[slot] == FREE || slotGeneration[slot] != ClaimIds.generation(claimId)) {
            return -1;
        }
        return slot;
    }

    public int freeCapacity() {
        return freeSlots.size();
    }

    public long take(int page, int pageGeneration, ClaimKind kind, int tenant, long owner, long peer) {
        if (freeSlots.size() == 0) {
            throw new ClaimCapacityException("all " + state.length + " claim slots are in use; raise maxClaims");
        }
        int slot = freeSlots.pop();
        this.page[slot] = page;
        this.pageGeneration[slot] = pageGeneration;
        this.kind[slot] = (byte) kind.ordinal();
        this.tenant[slot] = tenant;
        this.owner[slot] = owner;
        this.peer[slot] = peer;
        state[slot] = LIVE;
        java.util.Arrays.fill(writtenSlots, slot * wordsPerPage, (slot + 1) * wordsPerPage, 0L);
        live++;
        return ClaimIds.encode(slot, slotGeneration[slot]);
    }

    public void revoke(int slot) {
        if (state[slot] == LIVE) {
            state[slot] = REVOKED;
            live--;
            revoked++;
        }
    }

    public void drop(int slot) {
        if (state[slot] == LIVE) {
            live--;
        } else if (state[slot] == REVOKED) {
            revoked--;
        }
        state[slot] = FREE;
        slotGeneration[slot] = slotGeneration[slot] == Integer.MAX_VALUE ? 1 : slotGeneration[slot] + 1;
        freeSlots.push(slot);
    }

    public int page(int slot) {
        return page[slot];
    }

    public int pageGeneration(int slot) {
        return pageGeneration[slot];
    }

    public byte state(int slot) {
        return state[slot];
    }

    public ClaimKind kind(int slot) {
        return KINDS[kind[slot]];
    }

    public int tenant(int slot) {
        return tenant[slot];
    }

    public long owner(int slot) {
        return owner[slot];
    }

    public long peer(int slot) {
        return peer[slot];
    }

    public void markWritten(int slot, int from, int to) {
        Bits.set(writtenSlots, slot * wordsPerPage, from, to);
    }

    public boolean wrote(int slot, int from, int to) {
        return Bits.allSet(writtenSlots, slot * wordsPerPage, from, to);
    }

    public int live() {
        return live;
    }

    public int revoked() {
        return revoked;
    }

    public long digest(long h) {
        for (int s = 0; s < state.length; s++) {
            if (state[s] != FREE) {
                h = Digests.mix(h, s);
                h = Digests.mix(h, state[s]);
                h = Digests.mix(h, slotGeneration[s]);
                h = Digests.mix(h, page[s]);
                h = Digests.mix(h, pageGeneration[s]);
            }
        }
        return Digests.mix(h, live * 31L + revoked);
    }
}
