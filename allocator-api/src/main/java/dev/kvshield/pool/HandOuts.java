package dev.kvshield.pool;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.extent.WrittenExtent;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.lifecycle.PageTransition;
import dev.kvshield.protection.Protection;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.quarantine.Quarantine;
import dev.kvshield.seal.SealedPages;
import dev.kvshield.tenant.Owners;
import dev.kvshield.tenant.TenantPolicy;
import java.util.Arrays;

/**
 * Hand-outs of one pool: pages to holders (free pages first, then sealed pages cleared for the
 * receiving tenant's level) and sealed pages back to their tenant (reclaim). Every check runs and
 * every step that can fail (clearing, unsealing) runs before a page moves; a failure of those
 * sends the pages it touched to the quarantine for scrub and retirement.
 *
 * <p>Guarded by the pool lock. Does not allocate except for a "none" answer's diagnostics.
 */
final class HandOuts {
    private final KvPagePool pool;
    private final PoolParts parts;
    private final int[] scratchPages;
    private final int[] scratchGenerations;
    private final int[] scratchTags;
    /** A row hand-out's rows, copied from the caller's arrays at the call ({@link #allocateRows}); grown to the most rows seen. */
    private int[] rowTenants = new int[8];
    private long[] rowHolders = new long[8];
    private int[] rowCounts = new int[8];
    private int[] rowLastWritten = new int[8];
    private volatile String haltReason;

    HandOuts(KvPagePool pool, PoolParts parts) {
        this.pool = pool;
        this.parts = parts;
        int pages = parts.table().pageCount();
        scratchPages = new int[pages];
        scratchGenerations = new int[pages];
        scratchTags = new int[pages];
    }

    /** Stops every hand-out with {@code reason} ({@code null}: resumes); read without the lock. */
    void halt(String reason) {
        haltReason = reason;
    }

    private void checkHandOuts(int tenant) {
        String reason = haltReason;
        if (reason != null) {
            throw new HandOutsHaltedException("pool " + pool.config().poolId() + " hands out no pages: " + reason);
        }
        requireAuditTrail(pool, parts, tenant, "hands out no pages");
    }

    /**
     * Throws unless {@code tenant}'s level needs no audit trail or an attached one records now (not
     * closed, sink not failed): never switchable, and read at each call, so a tenant registered or a
     * trail stopped after a failure is covered too.
     */
    static void requireAuditTrail(KvPagePool pool, PoolParts parts, int tenant, String what) {
        if (pool.protectionOf(tenant).requiresAuditTrail()) {
            String gap = parts.events().auditGap();
            if (gap != null) {
                throw new HandOutsHaltedException("pool " + pool.config().poolId() + " " + what + " to tenant " + tenant + " ("
                        + pool.levelOf(tenant) + "): its level requires an audit trail that records, and " + gap);
            }
        }
    }

    /** {@link KvPagePool#allocateRows}, under the pool lock. */
    boolean allocateRows(int rows, int[] tenantsOfRows, long[] holders, int[] counts, LeaseKind kind, long[] leasesOut,
            int outOffset) {
        return allocateRows(rows, tenantsOfRows, holders, counts, null, kind, leasesOut, outOffset);
    }

    /**
     * {@link KvPagePool#allocateRowsWritten} ({@code lastWritten} non-null: each row's pages recorded as
     * written once handed out), else {@link KvPagePool#allocateRows}; under the pool lock.
     *
     * <p>Implementation notes: once every check passed, a row's pages are handed out in two loops (page table and written
     * extent, then leases), and the events follow in the order a page-by-page hand-out emits them: nothing between them can
     * fail or read the pool.
     */
    boolean allocateRows(int rows, int[] tenantsOfRows, long[] holders, int[] counts, int[] lastWritten, LeaseKind kind,
            long[] leasesOut, int outOffset) {
        if (lastWritten != null) {
            Guards.range("lastWritten", lastWritten.length, 0, rows);
        }
        // NOTE: checked and applied from one copy: the caller's arrays may change during the drain's call-outs
        copyRows(rows, tenantsOfRows, holders, counts, lastWritten);
        return allocateCopiedRows(rows, rowTenants, rowHolders, rowCounts, lastWritten == null ? null : rowLastWritten, kind,
                leasesOut, outOffset);
    }

    private void copyRows(int rows, int[] tenantsOfRows, long[] holders, int[] counts, int[] lastWritten) {
        if (rows > rowTenants.length) {
            rowTenants = new int[rows];
            rowHolders = new long[rows];
            rowCounts = new int[rows];
            rowLastWritten = new int[rows];
        }
        System.arraycopy(tenantsOfRows, 0, rowTenants, 0, rows);
        System.arraycopy(holders, 0, rowHolders, 0, rows);
        System.arraycopy(counts, 0, rowCounts, 0, rows);
        if (lastWritten != null) {
            System.arraycopy(lastWritten, 0, rowLastWritten, 0, rows);
        }
    }

    private boolean allocateCopiedRows(int rows, int[] tenantsOfRows, long[] holders, int[] counts, int[] lastWritten,
            LeaseKind kind, long[] leasesOut, int outOffset) {
        if (lastWritten != null) {
            if (kind != null && !kind.mayWrite()) { // NOTE: a null kind is refused with the holders below
                throw new IllegalArgumentException("a " + kind + " lease may not write; pages handed out as written need a writer kind");
            }
            int slots = parts.geometry().pageSizeTokens();
            for (int r = 0; r < rows; r++) {
                if (lastWritten[r] < 0 || lastWritten[r] > slots) {
                    throw new IllegalArgumentException("row " + r + ": written slots of its last page must be in [0, " + slots + "]: "
                            + lastWritten[r]);
                }
            }
        }
        long total = 0;
        Protection clearing = null;
        for (int r = 0; r < rows; r++) {
            parts.guards().tenant(tenantsOfRows[r]);
            Guards.holder(kind, holders[r]);
            if (counts[r] < 0) {
                Guards.range("leasesOut", leasesOut.length, outOffset, counts[r]);
            }
            checkHandOuts(tenantsOfRows[r]);
            total += counts[r];
            Protection p = pool.protectionOf(tenantsOfRows[r]);
            clearing = clearing == null || p.verifiesHandOut() ? p : clearing;
        }
        Guards.range("leasesOut", leasesOut.length, outOffset, (int) Math.min(total, Integer.MAX_VALUE));
        if (total == 0) {
            return true;
        }
        int count = (int) total;
        parts.leases().checkRoom(count, 0);
        for (int r = 0; r < rows; r++) {
            int t = tenantsOfRows[r];
            int quota = parts.tenants().policy(t).quotaPages();
            if (quota == TenantPolicy.UNLIMITED || (r > 0 && tenantsOfRows[r - 1] == t)) {
                continue; // NOTE: a run of rows of one tenant is summed once, at its first row
            }
            long asked = 0;
            for (int q = 0; q < rows; q++) {
                asked += tenantsOfRows[q] == t ? counts[q] : 0;
            }
            if (parts.table().ownedBy(t) + asked > quota) {
                return parts.shortfall().none(Shortfall.QUOTA, t, (int) asked, quota, pool);
            }
        }
        int handOutNow = parts.table().freeCount() + parts.sealed().size();
        if (handOutNow < count) {
            // Drain only when the drain meets the request (what its batches' protection left reusable): a "none" leaves
            // the pool as it was.
            Quarantine quarantine = parts.quarantine();
            if (handOutNow + quarantine.queuedReusable() < count || handOutNow + quarantine.drainYield() < count) {
                return parts.shortfall().none(Shortfall.POOL, tenantsOfRows[0], count, TenantPolicy.UNLIMITED, pool);
            }
            quarantine.collect(Long.MAX_VALUE, true);
        }
        if (!clearSealedForHandOut(clearing, count)) {
            return parts.shortfall().none(Shortfall.POOL, tenantsOfRows[0], count, TenantPolicy.UNLIMITED, pool);
        }
        int fromFree = Math.min(count, parts.table().freeCount());
        parts.sealed().oldest(count - fromFree, scratchPages, fromFree);
        PageTable table = parts.table();
        table.popFree(fromFree, scratchPages, 0);
        for (int i = fromFree; i < count; i++) {
            parts.sealed().remove(scratchPages[i]);
        }
        LeaseTable leases = parts.leases();
        WrittenExtent extent = parts.extent();
        // NOTE: the new generation's written slots at once (none, or those emitHandedOutWritten reports)
        int wholePage = lastWritten == null ? 0 : parts.geometry().pageSizeTokens();
        int first = 0; // the row's first page in scratchPages
        for (int r = 0; r < rows; r++) {
            int n = counts[r];
            int tenant = tenantsOfRows[r];
            int lastPageWritten = lastWritten == null ? 0 : lastWritten[r];
            for (int i = first, last = first + n - 1; i <= last; i++) {
                int page = scratchPages[i];
                scratchGenerations[i] = table.handOut(page, tenant);
                extent.startGeneration(page, i < last ? wholePage : lastPageWritten);
            }
            leases.mintAll(scratchPages, scratchGenerations, first, n, tenant, holders[r], kind, leasesOut, outOffset + first);
            table.addOwned(tenant, n);
            first += n;
        }
        if (parts.events().hasListeners()) {
            emitHandedOut(rows, tenantsOfRows, holders, counts);
            if (lastWritten != null) {
                emitHandedOutWritten(rows, tenantsOfRows, holders, counts, lastWritten, leasesOut, outOffset);
            }
        }
        parts.metrics().allocated(count);
        parts.shortfall().clear();
        return true;
    }

    /**
     * The ALLOCATE events of the {@code scratchPages} just handed out with their {@code scratchGenerations}, a row's pages
     * in order, rows in order: what handing them out page by page emits.
     */
    private void emitHandedOut(int rows, int[] tenantsOfRows, long[] holders, int[] counts) {
        for (int r = 0, i = 0; r < rows; r++) {
            for (int end = i + counts[r]; i < end; i++) {
                parts.events().emit(PageEventType.ALLOCATE, scratchPages[i], scratchGenerations[i], tenantsOfRows[r], holders[r], 0);
            }
        }
    }

    /**
     * The WRITE events of the pages just handed out as written, as {@link KvPagePool#markWritten}
     * through each new lease would emit them, in the same order (a row's pages in order, rows in
     * order, after every page's ALLOCATE): every page of a row whole, its last page {@code [0,
     * lastWritten[r])}. The written slots themselves were recorded as each page was handed out.
     */
    private void emitHandedOutWritten(int rows, int[] tenantsOfRows, long[] holders, int[] counts, int[] lastWritten,
            long[] leasesOut, int outOffset) {
        int slots = parts.geometry().pageSizeTokens();
        int i = outOffset;
        for (int r = 0; r < rows; r++) {
            int tenant = tenantsOfRows[r];
            long holder = holders[r];
            for (int k = 0, n = counts[r]; k < n; k++, i++) {
                int to = k == n - 1 ? lastWritten[r] : slots;
                if (to > 0) {
                    int page = scratchPages[i - outOffset];
                    parts.events().emit(PageEventType.WRITE, page, parts.table().generation(page), tenant, holder, to);
                }
            }
        }
    }

    /**
     * Clears the sealed pages a hand-out of {@code count} will take (the oldest, after free pages);
     * retires pages that are not zero afterwards and tries again with the next ones.
     *
     * @return false when too few pages remain
     */
    private boolean clearSealedForHandOut(Protection clearing, int count) {
        while (parts.table().freeCount() + parts.sealed().size() >= count) {
            int n = count - Math.min(count, parts.table().freeCount());
            if (n == 0) {
                return true;
            }
            parts.sealed().oldest(n, scratchPages, 0);
            int dirty;
            try {
                dirty = clearing.clearForHandOut(scratchPages, 0, n, scratchTags);
            } catch (RuntimeException | Error e) { // the pages' bytes are unknown whatever the backend threw
                for (int i = 0; i < n; i++) {
                    parts.sealed().remove(scratchPages[i]);
                }
                parts.quarantine().failTouched(scratchPages, 0, n);
                throw new ProtectionException("clearing " + n + " sealed pages for a " + clearing.level() + " hand-out failed; they"
                        + " are scrubbed and retired, nothing was handed out", e);
            }
            for (int i = 0; i < n; i++) {
                parts.sealed().markCleared(scratchPages[i]);
            }
            if (dirty == 0) {
                return true;
            }
            for (int i = 0; i < dirty; i++) {
                int page = scratchTags[i];
                parts.sealed().remove(page);
                parts.metrics().verifyFailed(1);
                parts.events().emit(PageEventType.VERIFY_FAILED, page, parts.table().generation(page), -1, Owners.NOBODY,
                        clearing.level().ordinal());
                parts.table().move(page, PageTransition.RETIRE);
                parts.events().emit(PageEventType.RETIRE, page, parts.table().generation(page), -1, Owners.NOBODY, RetireReason.VERIFY_FAILED.ordinal());
            }
        }
        return false;
    }

    /** {@link KvPagePool#reclaim}, under the pool lock. */
    int reclaim(int tenant, long holder, LeaseKind kind, long[] sealedRefs, int offset, int count, long[] leasesOut, int outOffset) {
        parts.guards().tenant(tenant);
        Guards.holder(kind, holder);
        Guards.range("sealedRefs", sealedRefs.length, offset, count);
        Guards.range("leasesOut", leasesOut.length, outOffset, count);
        checkHandOuts(tenant);
        parts.guards().beginPages();
        int quota = parts.tenants().policy(tenant).quotaPages();
        int room = quota == TenantPolicy.UNLIMITED ? Integer.MAX_VALUE : Math.max(0, quota - parts.table().ownedBy(tenant));
        int hits = 0;
        for (int i = 0; i < count; i++) {
            long ref = sealedRefs[offset + i];
            if (parts.sealed().classify(ref, tenant, holder) == SealedPages.RECLAIMABLE && hits < room
                    && !parts.guards().marked(PageHandles.page(ref))) {
                int page = PageHandles.page(ref);
                parts.guards().mark(page);
                scratchPages[hits] = page;
                scratchGenerations[hits] = parts.table().generation(page);
                scratchTags[hits++] = i;
            } else {
                parts.metrics().reclaimed(false);
            }
        }
        parts.leases().checkRoom(hits, 0);
        try {
            parts.sealed().unseal(tenant, scratchPages, scratchGenerations, scratchTags, hits);
        } catch (ProtectionException e) {
            for (int h = 0; h < hits; h++) {
                parts.sealed().remove(scratchPages[h]);
            }
            parts.quarantine().failTouched(scratchPages, 0, hits);
            throw e;
        }
        Arrays.fill(leasesOut, outOffset, outOffset + count, LeaseIds.NONE);
        for (int h = 0; h < hits; h++) {
            int page = scratchPages[h];
            int epoch = parts.sealed().epoch(page);
            parts.sealed().remove(page);
            parts.table().move(page, PageTransition.RECLAIM);
            parts.table().setTenant(page, tenant);
            leasesOut[outOffset + scratchTags[h]] = parts.leases().mint(page, scratchGenerations[h], tenant, holder, kind, 0);
            parts.events().emit(PageEventType.RECLAIM, page, scratchGenerations[h], tenant, holder, epoch);
            parts.metrics().reclaimed(true);
        }
        parts.table().addOwned(tenant, hits);
        parts.metrics().allocated(hits);
        return hits;
    }
}
