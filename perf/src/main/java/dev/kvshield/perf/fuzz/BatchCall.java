package dev.kvshield.perf.fuzz;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.MemorySegment;
import java.util.EnumSet;
import java.util.Set;

/**
 * The pool calls a fuzz trace presents leases to, each as one batch of {@code (tenant, holder)}:
 * what kinds it takes and what it makes. {@link #WRITE}, {@link #READ} and their every-buffer forms
 * present one lease (the first of the batch). Calls that make holds make them for {@link #PROBE}, a
 * holder no actor is.
 */
public enum BatchCall {
    RELEASE(Kinds.CONTENT, false, null),
    /** A request ends its read of its prefix: the release of its reader leases (PrefixCache.unmatch). */
    UNMATCH(Kinds.CONTENT, false, null),
    CHECK_HELD(Kinds.CONTENT, false, null),
    SHARE(Kinds.PROVERS, false, LeaseKind.READER),
    TRANSFER(Kinds.PROVERS, false, LeaseKind.OWNER),
    CLAIM(Kinds.PROVERS, false, null),
    DROP_CLAIMS(Kinds.CLAIMS, true, null),
    FENCE_CLAIMS(Kinds.CLAIMS, true, null),
    WRITE(Kinds.WRITERS, false, null),
    READ(Kinds.READERS, false, null),
    /** {@link #WRITE} of the same slots of every buffer in one call ({@code writeAllBuffers}). */
    WRITE_ALL_BUFFERS(Kinds.WRITERS, false, null),
    /** {@link #READ} of the same slots of every buffer in one call ({@code readAllBuffers}). */
    READ_ALL_BUFFERS(Kinds.READERS, false, null);

    /** The holder shares and transfers of hostile batches go to: no request of any trace. */
    static final long PROBE = Owners.request(1_999_999);
    /** The transfer peer of claims a trace takes itself. */
    static final long CHURN_PEER = 77;

    private static final class Kinds {
        static final Set<LeaseKind> PROVERS = EnumSet.of(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION);
        static final Set<LeaseKind> CONTENT = EnumSet.of(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION, LeaseKind.READER,
                LeaseKind.DEFERRED_FREE);
        static final Set<LeaseKind> CLAIMS = EnumSet.of(LeaseKind.CLAIM_WRITER, LeaseKind.CLAIM_READER);
        static final Set<LeaseKind> WRITERS = EnumSet.of(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION,
                LeaseKind.CLAIM_WRITER);
        static final Set<LeaseKind> READERS = EnumSet.of(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION, LeaseKind.READER,
                LeaseKind.CLAIM_READER);
    }

    private final Set<LeaseKind> accepts;
    private final boolean claims;
    private final LeaseKind newKind;

    BatchCall(Set<LeaseKind> accepts, boolean claims, LeaseKind newKind) {
        this.accepts = accepts;
        this.claims = claims;
        this.newKind = newKind;
    }

    Set<LeaseKind> accepts() {
        return accepts;
    }

    /** Whether the call takes claims only (fenced ones too): dropClaims, fenceClaims. */
    boolean takesClaims() {
        return claims;
    }

    /** Whether the call presents one lease (the first of the batch): the data calls. */
    boolean presentsOne() {
        return this == WRITE || this == READ || this == WRITE_ALL_BUFFERS || this == READ_ALL_BUFFERS;
    }

    /** Whether the call makes new holds on the presented leases' pages (and so refuses a page listed twice). */
    boolean makesHolds() {
        return this == SHARE || this == TRANSFER || this == CLAIM;
    }

    /** The kind of hold {@link #PROBE} gets, for calls that give it one. */
    LeaseKind newKind() {
        return newKind;
    }

    long newHolder() {
        return PROBE;
    }

    /**
     * Makes the call; {@code out} receives new leases or claims; {@code data} is the bytes
     * {@link #WRITE} writes and {@link #READ} reads (whole slots of buffer 0 from slot 0); the
     * every-buffer forms move the same slots of each buffer through slices of it.
     */
    void apply(KvPagePool pool, int tenant, long holder, long[] batch, int count, long[] out, MemorySegment data) {
        switch (this) {
            case RELEASE, UNMATCH -> pool.release(tenant, holder, batch, 0, count, ReleaseReason.FINISHED);
            case CHECK_HELD -> pool.checkHeld(tenant, holder, batch, 0, count);
            case SHARE -> pool.share(tenant, holder, batch, 0, count, LeaseKind.READER, tenant, PROBE, out, 0);
            case TRANSFER -> pool.transfer(tenant, holder, batch, 0, count, LeaseKind.OWNER, PROBE, out, 0);
            case CLAIM -> pool.claim(tenant, holder, batch, 0, count, ClaimKind.WRITER, CHURN_PEER, out, 0);
            case DROP_CLAIMS -> pool.dropClaims(tenant, holder, batch, 0, count);
            case FENCE_CLAIMS -> pool.fenceClaims(tenant, holder, batch, 0, count);
            case WRITE -> pool.write(tenant, holder, batch[0], 0, 0, data);
            case READ -> pool.read(tenant, holder, batch[0], 0, 0, data);
            case WRITE_ALL_BUFFERS -> pool.writeAllBuffers(tenant, holder, batch[0], 0, everyBuffer(pool, data));
            case READ_ALL_BUFFERS -> pool.readAllBuffers(tenant, holder, batch[0], 0, everyBuffer(pool, data));
        }
    }

    /** One slice of {@code data} per buffer, each the slots {@code data} holds of buffer 0. */
    private static MemorySegment[] everyBuffer(KvPagePool pool, MemorySegment data) {
        PoolGeometry g = pool.geometry();
        long tokens = data.byteSize() / g.bytesPerToken(0);
        MemorySegment[] segments = new MemorySegment[g.bufferCount()];
        for (int b = 0; b < segments.length; b++) {
            segments[b] = data.asSlice(0, tokens * g.bytesPerToken(b));
        }
        return segments;
    }
}
