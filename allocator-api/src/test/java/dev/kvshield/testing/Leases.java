package dev.kvshield.testing;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.pool.KvPagePool;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * One-lease conveniences over the pool's batch calls, for tests: each presents the lease as the
 * holder it was minted to, as an engine adapter would.
 */
public final class Leases {
    private Leases() {}

    /** The handles (page and generation) of live leases: what a sealed reference is computed from, before the release. */
    public static long[] handles(KvPagePool pool, long[] leases) {
        long[] out = new long[leases.length];
        for (int i = 0; i < leases.length; i++) {
            out[i] = pool.view().handleOf(leases[i]);
        }
        return out;
    }

    /** Takes one claim on the page of {@code lease} (held by {@code (tenant, holder)}); returns the claim. */
    public static long claim(KvPagePool pool, int tenant, long holder, long lease, ClaimKind kind, long peer) {
        long[] out = new long[1];
        pool.claim(tenant, holder, new long[] {lease}, 0, 1, kind, peer, out, 0);
        return out[0];
    }

    /** Writes through a lease (a claim, usually) as its holder. */
    public static void write(KvPagePool pool, long lease, int buffer, int slot, MemorySegment src) {
        pool.write(pool.view().tenantOfLease(lease), pool.view().holderOf(lease), lease, buffer, slot, src);
    }

    /** Reads through a lease (a claim, usually) as its holder. */
    public static void read(KvPagePool pool, long lease, int buffer, int slot, MemorySegment dst) {
        pool.read(pool.view().tenantOfLease(lease), pool.view().holderOf(lease), lease, buffer, slot, dst);
    }

    /**
     * Writes every slot of every buffer of the lease's page through the lease, as {@code (tenant,
     * holder)}, with the pattern of {@code (tenant, patternRequest)} at that page.
     */
    public static void fillPage(KvPagePool pool, Arena arena, int tenant, long holder, long lease, long patternRequest) {
        int page = pool.view().pageOf(lease);
        for (int b = 0; b < pool.geometry().bufferCount(); b++) {
            pool.write(tenant, holder, lease, b, 0, Patterns.fill(arena, pool.geometry().pageBytes(b), tenant, patternRequest, page, b));
        }
    }

    /** Allocates {@code count} OWNER pages to {@code (tenant, holder)} and fills each with the (tenant, patternRequest) pattern. */
    public static long[] allocateWritten(KvPagePool pool, Arena arena, int tenant, long holder, int count, long patternRequest) {
        long[] leases = new long[count];
        if (!pool.allocate(tenant, holder, LeaseKind.OWNER, count, leases, 0)) {
            throw new IllegalStateException("no " + count + " pages: " + pool.lastShortfall());
        }
        for (long lease : leases) {
            fillPage(pool, arena, tenant, holder, lease, patternRequest);
        }
        return leases;
    }

    public static void markWritten(KvPagePool pool, long lease, int fromSlot, int toSlot) {
        pool.markWritten(pool.view().tenantOfLease(lease), pool.view().holderOf(lease), lease, fromSlot, toSlot);
    }

    /** Drops claims, all of one holder (that of the first). */
    public static void dropClaims(KvPagePool pool, long[] claims, int offset, int count) {
        long first = claims[offset];
        pool.dropClaims(pool.view().tenantOfLease(first), pool.view().holderOf(first), claims, offset, count);
    }

    public static void fence(KvPagePool pool, long claim) {
        pool.fenceClaims(pool.view().tenantOfLease(claim), pool.view().holderOf(claim), new long[] {claim}, 0, 1);
    }

    /** Adds {@code readerRequest} of the owner's tenant as a reader of the page of {@code lease}; returns the reader lease. */
    public static long addReader(KvPagePool pool, int tenant, long holder, long lease, long readerRequest) {
        return addReader(pool, tenant, holder, lease, tenant, readerRequest);
    }

    public static long addReader(KvPagePool pool, int tenant, long holder, long lease, int readerTenant, long readerRequest) {
        long[] out = new long[1];
        pool.share(tenant, holder, new long[] {lease}, 0, 1, LeaseKind.READER, readerTenant, readerRequest, out, 0);
        return out[0];
    }

    /** Ends {@code readerRequest}'s reader lease on the page of {@code lease}. */
    public static void removeReader(KvPagePool pool, int tenant, long holder, long lease, long readerRequest) {
        removeReader(pool, tenant, holder, lease, tenant, readerRequest);
    }

    public static void removeReader(KvPagePool pool, int tenant, long holder, long lease, int readerTenant, long readerRequest) {
        long reader = pool.view().leaseOf(pool.view().pageOf(lease), readerTenant, readerRequest, LeaseKind.READER);
        pool.release(readerTenant, readerRequest, new long[] {reader}, 0, 1, ReleaseReason.FINISHED);
    }
}
