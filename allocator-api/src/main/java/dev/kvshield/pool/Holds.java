package dev.kvshield.pool;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.DuplicateLeaseException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.lifecycle.PageTransition;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.Protection;
import dev.kvshield.quarantine.Quarantine;
import dev.kvshield.tenant.ForeignAccessException;
import dev.kvshield.tenant.Owners;
import java.util.Arrays;

/**
 * The holds of one pool beyond hand-outs: sharing a held page with another holder, handing a hold
 * over, claims, and releasing holds (a page's last content hold moves its generation and sends it
 * to the quarantine). Each call checks every presented lease (live, its holder's, a kind the call
 * takes, listed once) before anything changes, then applies with no step that can fail.
 *
 * <p>Guarded by the pool lock. Does not allocate unless it refuses.
 */
final class Holds {
    static final int PROVERS = LeaseTable.kinds(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION);
    static final int CONTENT = PROVERS | LeaseTable.kinds(LeaseKind.READER, LeaseKind.DEFERRED_FREE);
    /** What a transfer takes: a proving hold, or a deferred free withdrawn (its page goes to another holder instead). */
    static final int TRANSFERABLE = PROVERS | LeaseTable.kinds(LeaseKind.DEFERRED_FREE);

    private final KvPagePool pool;
    private final PoolParts parts;
    /** A release's pages (a copy of the caller's, for {@link #releaseHeldPages}) and their new generations ({@link #releasedWhole}). */
    private final int[] scratchPages;
    private final int[] scratchGenerations;
    /** Per tenant id, the strategy of the batch being released ({@link #lookUpReleaseProtections}); grows with the tenants. */
    private Protection[] releaseProtections = new Protection[8];

    Holds(KvPagePool pool, PoolParts parts) {
        this.pool = pool;
        this.parts = parts;
        scratchPages = new int[parts.table().pageCount()];
        scratchGenerations = new int[parts.table().pageCount()];
    }

    /** Every check of {@link #share} (the presented holds, then the reader tenant's audit trail), changing nothing. */
    void checkShare(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, int toTenant, long toHolder) {
        checkNewHolds(tenant, holder, presented, offset, count, kind, toTenant, toHolder, "share", PROVERS);
        if (count > 0) {
            checkShareReader(toTenant);
        }
    }

    /** {@link KvPagePool#checkShareReader}: what {@link #share} refuses for its reader alone. */
    void checkShareReader(int toTenant) {
        parts.guards().tenant(toTenant);
        HandOuts.requireAuditTrail(pool, parts, toTenant, "grants no holds");
    }

    /** {@link KvPagePool#share}, under the pool lock. */
    void share(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, int toTenant, long toHolder,
            long[] leasesOut, int outOffset) {
        Guards.range("leasesOut", leasesOut.length, outOffset, count);
        checkShare(tenant, holder, presented, offset, count, kind, toTenant, toHolder);
        for (int i = 0; i < count; i++) {
            int s = parts.leases().batchSlot(i);
            int page = parts.leases().page(s);
            int g = parts.leases().generation(s);
            leasesOut[outOffset + i] = parts.leases().mint(page, g, toTenant, toHolder, kind, 0);
            if (kind == LeaseKind.READER) {
                parts.events().emit(PageEventType.READER_ADDED, page, g, toTenant, holder, toHolder);
            } else {
                parts.events().emit(PageEventType.HOLD_ADDED, page, g, toTenant, toHolder, kind.ordinal());
            }
        }
    }

    /** {@link KvPagePool#transfer}, under the pool lock. */
    void transfer(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, long toHolder,
            long[] leasesOut, int outOffset) {
        Guards.range("leasesOut", leasesOut.length, outOffset, count);
        checkNewHolds(tenant, holder, presented, offset, count, kind, tenant, toHolder, "transfer", TRANSFERABLE);
        for (int i = 0; i < count; i++) {
            int s = parts.leases().batchSlot(i);
            int page = parts.leases().page(s);
            int g = parts.leases().generation(s);
            // NOTE: the hold changes hands in its slot (a new id; the presented one is dead), as a mint then a drop would
            leasesOut[outOffset + i] = parts.leases().remint(s, toHolder, kind);
            parts.events().emit(PageEventType.OWNERSHIP_TRANSFER, page, g, tenant, toHolder, holder);
            if (toHolder != holder) { // else the holder keeps a content hold on the page: nothing is orphaned
                fenceOrphanedWriters(page, tenant, holder);
            }
        }
    }

    /**
     * A holder whose last content hold on a page just ended, while others keep the page, may no
     * longer write it through its claims (a late transfer would overwrite what the others read):
     * its writer claims there are fenced. Its reader claims stay, as they only read.
     */
    private void fenceOrphanedWriters(int page, int tenant, long holder) {
        if (parts.leases().holdsContent(page, tenant, holder)) {
            return;
        }
        for (int c = parts.leases().writerClaimOf(page, tenant, holder); c >= 0; c = parts.leases().writerClaimOf(page, tenant, holder)) {
            parts.leases().fence(c);
            parts.events().emitClaim(PageEventType.CLAIM_FENCED, page, parts.leases().generation(c), tenant, holder,
                    parts.leases().id(c), ClaimKind.WRITER, parts.leases().peer(c));
        }
    }

    /** {@link KvPagePool#claim}, under the pool lock. */
    void claim(int tenant, long holder, long[] presented, int offset, int count, ClaimKind kind, long peer, long[] claimsOut,
            int outOffset) {
        parts.guards().tenant(tenant);
        if (kind == null) {
            throw new IllegalArgumentException("claim kind must not be null");
        }
        Guards.range("leases", presented.length, offset, count);
        Guards.range("claimsOut", claimsOut.length, outOffset, count);
        parts.leases().beginBatch();
        parts.guards().beginPages();
        for (int i = offset; i < offset + count; i++) {
            int s = parts.leases().checkHeld(presented[i], tenant, holder, PROVERS, "claim");
            parts.leases().markOnce(s, "claim");
            parts.guards().pageOnce(parts.leases().page(s), presented[i], tenant, holder, "claim");
        }
        parts.leases().checkRoom(count, count);
        for (int i = 0; i < count; i++) {
            int s = parts.leases().batchSlot(i);
            int page = parts.leases().page(s);
            long c = parts.leases().mint(page, parts.leases().generation(s), tenant, holder, LeaseKind.ofClaim(kind), peer);
            claimsOut[outOffset + i] = c;
            parts.events().emitClaim(PageEventType.CLAIM_TAKEN, page, parts.leases().generation(s), tenant, holder, c, kind, peer);
        }
    }

    /** {@link KvPagePool#release}, under the pool lock. */
    void release(int tenant, long holder, long[] presented, int offset, int count, ReleaseReason reason, long step) {
        parts.guards().tenant(tenant);
        Guards.range("leases", presented.length, offset, count);
        if (reason == null) {
            throw new IllegalArgumentException("release reason must not be null");
        }
        LeaseTable leases = parts.leases();
        leases.beginBatch();
        for (int i = offset; i < offset + count; i++) {
            leases.markOnce(leases.checkHeld(presented[i], tenant, holder, CONTENT, "release"), "release");
        }
        if (count <= scratchPages.length) { // NOTE: more leases than pages: some page has two, so not every page is released whole
            leases.batchPages(count, scratchPages);
            if (leases.soleHolds(scratchPages, 0, count) && releasedWhole(tenant, holder, scratchPages, 0, count, reason, step)) {
                return;
            }
        }
        releaseHoldByHold(tenant, holder, count, reason, step);
    }

    /** {@link KvPagePool#releaseHeldPages}, under the pool lock. */
    boolean releaseHeldPages(int tenant, long holder, LeaseKind kind, int[] pages, int offset, int count, ReleaseReason reason,
            long step, long[] leasesOut, int outOffset) {
        parts.guards().tenant(tenant);
        Guards.range("pages", pages.length, offset, count);
        Guards.range("leasesOut", leasesOut.length, outOffset, count);
        if (reason == null || kind == null || !kind.holdsContent()) {
            throw new IllegalArgumentException("releaseHeldPages needs a reason and a content kind: reason=" + reason + " kind=" + kind);
        }
        // NOTE: checked and applied from one copy: the caller's array may change during the call-outs (a sealer's canSeal)
        int[] presented = count <= scratchPages.length ? scratchPages : new int[count]; // more: a page listed twice, refused
        System.arraycopy(pages, offset, presented, 0, count);
        LeaseTable leases = parts.leases();
        int pageCount = parts.table().pageCount();
        leases.beginBatch();
        parts.guards().beginPages();
        // NOTE: the held pages before the first that is not (every page, in a free the engine got right) in one pass
        int held = leases.markHeldPages(presented, 0, count, tenant, holder, kind, "release", leasesOut, outOffset);
        boolean allHeld = held == count;
        for (int i = held; i < count; i++) {
            int page = presented[i];
            boolean inPool = page >= 0 && page < pageCount;
            int s = inPool ? leases.slotHeld(page, tenant, holder, kind) : -1;
            long lease = s < 0 ? LeaseIds.NONE : leases.id(s);
            leasesOut[outOffset + i] = lease;
            // NOTE: a page listed twice throws here, before anything changed: a held one by its lease, another by its page
            if (s >= 0) {
                leases.markOnce(s, "release");
            } else {
                allHeld = false;
                if (inPool) {
                    parts.guards().pageOnce(page, lease, tenant, holder, "releaseHeldPages");
                }
            }
        }
        if (allHeld && !(leases.markedSole() && releasedWhole(tenant, holder, presented, 0, count, reason, step))) {
            releaseHoldByHold(tenant, holder, count, reason, step);
        }
        return allHeld;
    }

    /**
     * Ends the {@code count} holds of the checked batch ({@link LeaseTable#batchSlot}), whose pages are {@code pages[offset,
     * offset + count)} in order and each its page's only hold, when every page is one tenant's (the usual release): each
     * page goes to its next generation and the quarantine as {@link #releaseHoldByHold} would take it, with the same RELEASE
     * events in page order (no hold is left on any page, so no HOLD_DROPPED or fencing).
     *
     * <p>Implementation notes: part by part (leases, then page table and quarantine together), each one loop over the
     * pages, and the tenant's protection looked up once.
     *
     * @return false, nothing changed, when the pages are of several tenants
     */
    private boolean releasedWhole(int tenant, long holder, int[] pages, int offset, int count, ReleaseReason reason, long step) {
        PageTable table = parts.table();
        int pageTenant = table.commonTenant(pages, offset, count);
        if (pageTenant < 0) {
            return false;
        }
        // NOTE: the one call out (a sealer's canSeal) before the first change: if it throws, nothing changed
        Protection protection = pool.protectionOf(pageTenant).forRelease(pageTenant);
        parts.leases().dropSoleHolds(pages, offset, count);
        parts.quarantine().releaseUnclaimed(pages, offset, count, pageTenant, protection, PageHandles.MAX_GENERATION,
                scratchGenerations);
        PageEvents events = parts.events();
        if (events.hasListeners()) {
            for (int i = 0; i < count; i++) {
                events.emit(PageEventType.RELEASE, pages[offset + i], scratchGenerations[i], tenant, holder, reason.ordinal());
            }
        }
        table.addOwned(pageTenant, -count);
        parts.metrics().released(count);
        parts.quarantine().submitPending(step);
        return true;
    }

    /**
     * Ends the {@code count} holds of the checked batch one by one, in order: any release.
     *
     * <p>Implementation notes: the protection of every tenant whose page the batch names is looked up first ({@link
     * #lookUpReleaseProtections}), so the loop calls nothing outside the pool: a sealer whose {@code canSeal} throws
     * leaves every hold as it was, and no listener can be added while the loop emits (read once).
     */
    private void releaseHoldByHold(int tenant, long holder, int count, ReleaseReason reason, long step) {
        LeaseTable leases = parts.leases();
        PageTable table = parts.table();
        Quarantine quarantine = parts.quarantine();
        PageEvents events = parts.events();
        lookUpReleaseProtections(count);
        boolean emitting = events.hasListeners();
        int released = 0;
        int protectedTenant = -1;
        int runReleased = 0; // pages of protectedTenant released since its run began, owned counts updated per run
        Protection protection = null;
        for (int i = 0; i < count; i++) {
            int s = leases.batchSlot(i);
            int page = leases.page(s);
            if (leases.drop(s) > 0) {
                holdDropped(s, page, tenant, holder);
                continue;
            }
            int next = table.bumpGeneration(page);
            table.move(page, PageTransition.RELEASE);
            int pageTenant = table.tenant(page);
            if (emitting) {
                events.emit(PageEventType.RELEASE, page, next, tenant, holder, reason.ordinal());
            }
            if (pageTenant != protectedTenant) { // one lookup (and one owned-count update) per run of pages of one tenant
                if (runReleased > 0) {
                    table.addOwned(protectedTenant, -runReleased);
                }
                protectedTenant = pageTenant;
                runReleased = 0;
                protection = releaseProtections[pageTenant];
            }
            runReleased++;
            quarantine.released(page, next, protection, leases.claimHolds(page) > 0, next == PageHandles.MAX_GENERATION);
            released++;
        }
        if (runReleased > 0) {
            table.addOwned(protectedTenant, -runReleased);
        }
        parts.metrics().released(released);
        quarantine.submitPending(step);
    }

    /**
     * Sets {@code releaseProtections[t]} to the strategy a release by tenant {@code t} gets now
     * ({@link Protection#forRelease}) for every tenant of a page the checked batch's first {@code count} holds name.
     */
    private void lookUpReleaseProtections(int count) {
        LeaseTable leases = parts.leases();
        PageTable table = parts.table();
        int last = -1;
        for (int i = 0; i < count; i++) {
            int t = table.tenant(leases.page(leases.batchSlot(i)));
            if (t != last && t >= 0) { // NOTE: a run of one tenant's pages asks once
                if (t >= releaseProtections.length) {
                    releaseProtections = Arrays.copyOf(releaseProtections, Math.max(t + 1, 2 * releaseProtections.length));
                }
                releaseProtections[t] = pool.protectionOf(t).forRelease(t);
                last = t;
            }
        }
    }

    /** A release ended {@code (tenant, holder)}'s hold in slot {@code s} on {@code page}, which others still hold. */
    private void holdDropped(int s, int page, int tenant, long holder) {
        LeaseKind kind = parts.leases().kindOf(s); // NOTE: a dropped slot keeps its kind until it is minted again
        parts.events().emit(kind == LeaseKind.READER ? PageEventType.READER_REMOVED : PageEventType.HOLD_DROPPED, page,
                parts.table().generation(page), tenant, holder, kind == LeaseKind.READER ? holder : kind.ordinal());
        fenceOrphanedWriters(page, tenant, holder);
    }

    /** {@link KvPagePool#checkHeld}, under the pool lock. */
    void checkHeld(int tenant, long holder, long[] presented, int offset, int count) {
        parts.guards().tenant(tenant);
        Guards.range("leases", presented.length, offset, count);
        parts.leases().beginBatch();
        for (int i = offset; i < offset + count; i++) {
            parts.leases().markOnce(parts.leases().checkHeld(presented[i], tenant, holder, CONTENT, "release"), "release");
        }
    }

    /** {@link KvPagePool#refuseFree}, under the pool lock. */
    ForeignAccessException refuseFree(int page, int tenant, long holder) {
        if (tenant >= 0) { // NOTE: -1 is a free no tenant presented (bare slots outside any release)
            parts.guards().tenant(tenant);
        }
        parts.geometry().checkPage(page);
        int g = parts.table().generation(page);
        if (!parts.table().is(page, PageState.OWNED)) {
            return parts.events().reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, g, tenant, holder, LeaseIds.NONE,
                    new ForeignAccessException("free of page " + page + " by tenant " + tenant + " " + Owners.describe(holder)
                            + " refused: the page is " + parts.table().state(page) + " at generation " + g
                            + " (freed already, or never this holder's)"));
        }
        long deferred = tenant < 0 ? LeaseIds.NONE : parts.leases().find(page, tenant, holder, LeaseKind.DEFERRED_FREE);
        if (deferred != LeaseIds.NONE) {
            return parts.events().reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, g, tenant, holder, deferred,
                    new ForeignAccessException("free of page " + page + " by tenant " + tenant + " " + Owners.describe(holder)
                            + " refused: this holder freed it already (a deferred free, lease " + deferred + ", at generation " + g + ")"));
        }
        return parts.events().reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, g, tenant, holder, LeaseIds.NONE,
                new ForeignAccessException("free of page " + page + " by tenant " + tenant + " " + Owners.describe(holder)
                        + " refused: the page is OWNED by tenant " + parts.table().tenant(page) + " at generation " + g + " with "
                        + parts.leases().contentHolds(page) + " hold(s), none of them this holder's"));
    }

    /** {@link KvPagePool#dropClaims}, under the pool lock. */
    void dropClaims(int tenant, long holder, long[] claims, int offset, int count, long step) {
        checkClaims(tenant, holder, claims, offset, count);
        for (int i = offset; i < offset + count; i++) {
            int s = parts.leases().batchSlot(i - offset);
            int page = parts.leases().page(s);
            parts.events().emitClaim(PageEventType.CLAIM_DROPPED, page, parts.leases().generation(s), tenant, holder, claims[i],
                    parts.leases().claimKind(s), parts.leases().peer(s));
            if (parts.leases().drop(s) == 0 && parts.table().is(page, PageState.QUARANTINED)) {
                parts.quarantine().claimsDrained(page);
            }
        }
        parts.quarantine().submitPending(step);
    }

    /** {@link KvPagePool#fenceClaims}, under the pool lock. */
    void fenceClaims(int tenant, long holder, long[] claims, int offset, int count) {
        checkClaims(tenant, holder, claims, offset, count);
        for (int i = offset; i < offset + count; i++) {
            int s = parts.leases().batchSlot(i - offset);
            if (parts.leases().fence(s)) {
                parts.events().emitClaim(PageEventType.CLAIM_FENCED, parts.leases().page(s), parts.leases().generation(s), tenant, holder, claims[i],
                        parts.leases().claimKind(s), parts.leases().peer(s));
            }
        }
    }

    /** Checks a share or transfer of the presented holds as the call would, changing nothing. */
    void checkNewHolds(int tenant, long holder, long[] presented, int offset, int count, LeaseKind kind, int toTenant,
            long toHolder, String what, int presentable) {
        parts.guards().tenant(tenant);
        parts.guards().tenant(toTenant);
        Guards.holder(kind, toHolder);
        Guards.range("leases", presented.length, offset, count);
        parts.leases().beginBatch();
        parts.guards().beginPages();
        for (int i = offset; i < offset + count; i++) {
            int s = parts.leases().checkHeld(presented[i], tenant, holder, presentable, what);
            parts.leases().markOnce(s, what);
            int page = parts.leases().page(s);
            parts.guards().pageOnce(page, presented[i], tenant, holder, what);
            int pageTenant = parts.table().tenant(page);
            if (toTenant != pageTenant && !(kind == LeaseKind.READER && parts.guards().isShared(pageTenant)
                    && !parts.tenants().policy(toTenant).regulated())) {
                throw parts.events().reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, parts.table().generation(page), toTenant, toHolder,
                        presented[i], new ForeignAccessException(what + ": tenant " + toTenant + " may not hold page " + page
                                + " of tenant " + pageTenant + " as " + kind + (parts.guards().isShared(pageTenant)
                                        ? " (only non-regulated readers of a shared namespace)" : " (not a shared namespace)")));
            }
            long existing = parts.leases().find(page, toTenant, toHolder, kind);
            if (existing != LeaseIds.NONE) {
                throw parts.events().reject(Rejection.DOUBLE_FREE, PageEventType.REJECT_DOUBLE_FREE, page, parts.table().generation(page), toTenant,
                        toHolder, presented[i], new DuplicateLeaseException(existing, what + ": tenant "
                                + toTenant + " " + Owners.describe(toHolder) + " already holds page " + page + " as " + kind
                                + " (lease " + existing + ")"));
            }
        }
        parts.leases().checkRoom(count, 0);
    }

    private void checkClaims(int tenant, long holder, long[] claims, int offset, int count) {
        parts.guards().tenant(tenant);
        Guards.range("claims", claims.length, offset, count);
        parts.leases().beginBatch();
        for (int i = offset; i < offset + count; i++) {
            parts.leases().markOnce(parts.leases().checkClaim(claims[i], tenant, holder), "claim");
        }
    }

}
