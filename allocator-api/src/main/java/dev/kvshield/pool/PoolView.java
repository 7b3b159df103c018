package dev.kvshield.pool;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.extent.WrittenExtent;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.seal.SealedPages;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Read-only queries over a pool's page table and leases, single and in batches: what an engine
 * bridge asks instead of keeping a copy of the pool's state. Nothing here changes the pool or
 * reports a rejection; a lease that is not live answers "none" ({@code -1}, {@link LeaseIds#NONE}).
 *
 * <p>Thread-safe: each call takes the pool lock once. Batch calls fill caller-owned arrays and do
 * not allocate.
 */
public final class PoolView {
    private static final int PRIMARY = LeaseTable.kinds(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION);

    private final ReentrantLock lock;
    private final PageTable table;
    private final LeaseTable leases;
    private final SealedPages sealed;
    private final WrittenExtent extent;
    private final LeaseIds ids;

    PoolView(ReentrantLock lock, PageTable table, LeaseTable leases, SealedPages sealed, WrittenExtent extent) {
        this.lock = lock;
        this.table = table;
        this.leases = leases;
        this.sealed = sealed;
        this.extent = extent;
        this.ids = leases.ids();
    }

    /** The codec of this pool's lease ids. */
    public LeaseIds leaseIds() {
        return ids;
    }

    public PageState stateOf(int page) {
        checkPage(page);
        lock.lock();
        try {
            return table.state(page);
        } finally {
            lock.unlock();
        }
    }

    /** The page's current generation. */
    public int generationOf(int page) {
        checkPage(page);
        lock.lock();
        try {
            return table.generation(page);
        } finally {
            lock.unlock();
        }
    }

    /** The tenant of an OWNED page, else -1. */
    public int tenantOf(int page) {
        checkPage(page);
        lock.lock();
        try {
            return table.is(page, PageState.OWNED) ? table.tenant(page) : -1;
        } finally {
            lock.unlock();
        }
    }

    /** The tenant that may reclaim a SEALED page, or -1. */
    public int sealedFor(int page) {
        checkPage(page);
        lock.lock();
        try {
            return sealed.reclaimableBy(page);
        } finally {
            lock.unlock();
        }
    }

    /** Content holds (owner, namespace, reservation, readers, deferred frees) on a page. */
    public int contentHolds(int page) {
        checkPage(page);
        lock.lock();
        try {
            return leases.contentHolds(page);
        } finally {
            lock.unlock();
        }
    }

    /** Claims, live or fenced, on a page. */
    public int claims(int page) {
        checkPage(page);
        lock.lock();
        try {
            return leases.claimHolds(page);
        } finally {
            lock.unlock();
        }
    }

    public boolean isLive(long lease) {
        lock.lock();
        try {
            return leases.slotOf(lease) >= 0;
        } finally {
            lock.unlock();
        }
    }

    /** The page a lease names, live or dead ({@link LeaseIds}: the page is part of the id); -1 for a malformed id. Lock-free. */
    public int pageOf(long lease) {
        return ids.isWellFormed(lease) ? ids.page(lease) : -1;
    }

    /**
     * The handle (page and generation) of a live lease, or {@link PageHandles#NONE}: with
     * {@link PageHandles#sealedReference} it names the sealed page a release of this generation
     * leaves behind.
     */
    public long handleOf(long lease) {
        lock.lock();
        try {
            int s = leases.slotOf(lease);
            return s < 0 ? PageHandles.NONE : PageHandles.encode(leases.page(s), leases.generation(s));
        } finally {
            lock.unlock();
        }
    }

    /**
     * True if slots {@code [fromSlot, toSlot)} of a live content lease's page were written in its
     * generation; false for a lease that is not live or is a claim whose page moved on.
     */
    public boolean isWritten(long lease, int fromSlot, int toSlot) {
        if (fromSlot < 0 || toSlot < fromSlot || toSlot > slotsPerPage()) {
            throw new InvalidGeometryException("slots [" + fromSlot + ", " + toSlot + ") are outside a page of " + slotsPerPage()
                    + " slots");
        }
        lock.lock();
        try {
            int s = leases.slotOf(lease);
            if (s < 0) {
                return false;
            }
            int page = leases.page(s);
            return table.is(page, PageState.OWNED) && table.generation(page) == leases.generation(s)
                    && extent.allWritten(page, fromSlot, toSlot);
        } finally {
            lock.unlock();
        }
    }

    private int slotsPerPage() {
        return extent.slotsPerPage();
    }

    /** The kind of a live lease, or {@code null}. */
    public LeaseKind kindOf(long lease) {
        lock.lock();
        try {
            int s = leases.slotOf(lease);
            return s < 0 ? null : leases.kindOf(s);
        } finally {
            lock.unlock();
        }
    }

    /** The holder of a live lease, or {@link dev.kvshield.tenant.Owners#NOBODY}. */
    public long holderOf(long lease) {
        lock.lock();
        try {
            int s = leases.slotOf(lease);
            return s < 0 ? dev.kvshield.tenant.Owners.NOBODY : leases.holder(s);
        } finally {
            lock.unlock();
        }
    }

    /** The tenant a live lease was minted to (a reader's own tenant, not the page's), or -1. */
    public int tenantOfLease(long lease) {
        lock.lock();
        try {
            int s = leases.slotOf(lease);
            return s < 0 ? -1 : leases.tenant(s);
        } finally {
            lock.unlock();
        }
    }

    /**
     * A lease that may prove a hold on {@code page} (owner, cache namespace or reservation; the
     * earliest such hold still live), or {@link LeaseIds#NONE}: whom to claim a page in the name of.
     */
    public long primaryLeaseOf(int page) {
        checkPage(page);
        lock.lock();
        try {
            return leases.firstOf(page, PRIMARY);
        } finally {
            lock.unlock();
        }
    }

    /** The lease {@code (tenant, holder)} holds on {@code page} with {@code kind}, or {@link LeaseIds#NONE}. */
    public long leaseOf(int page, int tenant, long holder, LeaseKind kind) {
        checkPage(page);
        lock.lock();
        try {
            return leases.find(page, tenant, holder, kind);
        } finally {
            lock.unlock();
        }
    }

    /**
     * For each of {@code pages[offset, offset + count)}, the lease {@code (tenant, holder)} holds on
     * it with {@code kind}, or {@link LeaseIds#NONE}, into {@code out[outOffset..)}. A {@code tenant}
     * of -1 means each page's own tenant (a cache namespace's hold on pages of several tenants).
     *
     * @return how many pages have one
     */
    public int leasesOf(int[] pages, int offset, int count, int tenant, long holder, LeaseKind kind, long[] out, int outOffset) {
        Guards.range("pages", pages.length, offset, count);
        Guards.range("out", out.length, outOffset, count);
        lock.lock();
        try {
            int found = 0;
            for (int i = 0; i < count; i++) {
                int page = pages[offset + i];
                long lease = page < 0 || page >= table.pageCount() ? LeaseIds.NONE
                        : leases.find(page, tenant >= 0 ? tenant : table.tenant(page), holder, kind);
                out[outOffset + i] = lease;
                found += lease != LeaseIds.NONE ? 1 : 0;
            }
            return found;
        } finally {
            lock.unlock();
        }
    }

    /** For each of {@code pages[offset, offset + count)}, its tenant while OWNED, else -1, into {@code tenantsOut[outOffset..)}. */
    public void tenantsOf(int[] pages, int offset, int count, int[] tenantsOut, int outOffset) {
        Guards.range("pages", pages.length, offset, count);
        Guards.range("tenantsOut", tenantsOut.length, outOffset, count);
        lock.lock();
        try {
            for (int i = 0; i < count; i++) {
                int page = pages[offset + i];
                tenantsOut[outOffset + i] = page >= 0 && page < table.pageCount() && table.is(page, PageState.OWNED)
                        ? table.tenant(page) : -1;
            }
        } finally {
            lock.unlock();
        }
    }

    /** For each of {@code leases[offset, offset + count)}, the page it names ({@link #pageOf}), into {@code pagesOut[outOffset..)}. */
    public void pagesOf(long[] leaseIds, int offset, int count, int[] pagesOut, int outOffset) {
        Guards.range("leases", leaseIds.length, offset, count);
        Guards.range("pagesOut", pagesOut.length, outOffset, count);
        for (int i = 0; i < count; i++) {
            pagesOut[outOffset + i] = pageOf(leaseIds[offset + i]);
        }
    }

    private void checkPage(int page) {
        if (page < 0 || page >= table.pageCount()) {
            throw new InvalidGeometryException("page " + page + " is outside the pool's pages [0, " + table.pageCount() + ")");
        }
    }
}
