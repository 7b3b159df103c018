package dev.kvshield.seal;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.PageEvents;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.internal.Digests;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.lifecycle.PageTable;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.Owners;
import java.util.Arrays;
import java.util.BitSet;

/**
 * The SEALED pages of a pool (ENCRYPT): which tenant and key epoch sealed each, oldest first;
 * which sealed references a tenant may reclaim; unsealing them by epoch; crypto-shredding a tenant.
 *
 * <p>Not thread-safe: guarded by the pool lock. Used only by the pool (ModuleBoundariesTest keeps it
 * inside allocator-api).
 *
 * <p>Implementation notes: the pages in release order are a linked list over page indices, so a
 * reclaim removes from the middle in O(1) and hand-outs take the oldest (the least likely to be
 * reclaimed). A page sealed by a tenant that may no longer reclaim it (shredded, or whose
 * ciphertext may have been damaged) keeps {@code sealTenant = -1}: it is still SEALED, handed out
 * zeroed, never decrypted.
 */
public final class SealedPages {
    /** {@link #classify}: the reference names a page this tenant may reclaim now. */
    public static final int RECLAIMABLE = 0;
    /** {@link #classify}: the page is gone (handed out, shredded, key retired): the engine recomputes. */
    public static final int GONE = 1;

    private final PageTable table;
    private final PageSealer sealer;
    private final PageEvents events;
    private final PoolMetrics metrics;
    private final PageLru order;
    private final int[] sealTenant;
    private final int[] sealEpoch;
    /** Tenants shredded: a seal of theirs collected afterwards (issued before the shred) enters unreclaimable. */
    private final BitSet shredded = new BitSet();

    public SealedPages(PageTable table, PageSealer sealer, PageEvents events, PoolMetrics metrics) {
        this.table = table;
        this.sealer = sealer;
        this.events = events;
        this.metrics = metrics;
        int pages = table.pageCount();
        order = new PageLru(pages);
        sealTenant = new int[pages];
        Arrays.fill(sealTenant, -1);
        sealEpoch = new int[pages];
    }

    public int size() {
        return order.size();
    }

    /**
     * Records a page whose seal the backend confirmed (it is already SEALED in the table). A seal of a
     * tenant shredded since it was issued is recorded shredded at once (its {@code SHRED} event follows
     * its {@code SEAL}): the key it was sealed under is gone.
     */
    public void add(int page, int tenant, int epoch) {
        boolean gone = tenant >= 0 && shredded.get(tenant);
        sealTenant[page] = gone ? -1 : tenant;
        sealEpoch[page] = epoch;
        order.addLast(page);
        events.emit(PageEventType.SEAL, page, table.generation(page), tenant, Owners.NOBODY, epoch);
        if (gone) {
            events.emit(PageEventType.SHRED, page, table.generation(page), tenant, Owners.NOBODY, epoch);
        }
    }

    /** Writes the {@code n} oldest sealed pages into {@code out[offset..)}; {@code n <= size()}. */
    public void oldest(int n, int[] out, int offset) {
        int page = order.first();
        for (int i = 0; i < n; i++) {
            out[offset + i] = page;
            page = order.after(page);
        }
    }

    /** Takes a page out of the sealed set (handed out, reclaimed, or failed); its state is the caller's to move. */
    public void remove(int page) {
        order.remove(page);
        sealTenant[page] = -1;
    }

    /** A sealed page was zeroed for a hand-out: it stays in line, but its tenant can no longer reclaim it. */
    public void markCleared(int page) {
        sealTenant[page] = -1;
    }

    /** The tenant that may reclaim a SEALED page, or -1. */
    public int reclaimableBy(int page) {
        return table.is(page, PageState.SEALED) ? sealTenant[page] : -1;
    }

    public int epoch(int page) {
        return sealEpoch[page];
    }

    /**
     * Decides, without changing anything, whether {@code tenant} may reclaim the page a sealed
     * reference names. A reference of another tenant's page or an older generation of one sealed by
     * this tenant is counted and emitted as a rejection, and answers {@link #GONE} like any other
     * page that cannot come back.
     */
    public int classify(long ref, int tenant, long holder) {
        if (!PageHandles.isWellFormed(ref) || PageHandles.page(ref) >= table.pageCount()) {
            events.reject(Rejection.INVALID, PageEventType.REJECT_STALE, -1, 0, tenant, holder, ref, null);
            return GONE;
        }
        int page = PageHandles.page(ref);
        int by = reclaimableBy(page);
        if (by >= 0 && by != tenant) {
            events.reject(Rejection.FOREIGN, PageEventType.REJECT_FOREIGN, page, table.generation(page), tenant, holder, ref, null);
            return GONE;
        }
        if (by >= 0 && table.generation(page) != PageHandles.generation(ref)) {
            events.reject(Rejection.STALE, PageEventType.REJECT_STALE, page, table.generation(page), tenant, holder, ref, null);
            return GONE;
        }
        return by == tenant && sealer.isEpochAvailable(tenant, sealEpoch[page]) ? RECLAIMABLE : GONE;
    }

    /**
     * Decrypts pages sealed by {@code tenant} in place, one sealer call per key epoch; reorders
     * {@code pages}, {@code generations} and {@code tags} together so each epoch's pages are
     * adjacent. Runs before the pool changes anything for the reclaim.
     *
     * @throws ProtectionException if a call failed: every listed page's bytes are then unknown
     *     (some may be plaintext), and the caller must put all of them out of reach
     */
    public void unseal(int tenant, int[] pages, int[] generations, int[] tags, int count) {
        int done = 0;
        while (done < count) {
            int epoch = sealEpoch[pages[done]];
            int k = done;
            for (int i = done; i < count; i++) {
                if (sealEpoch[pages[i]] == epoch) {
                    swap(pages, i, k);
                    swap(generations, i, k);
                    swap(tags, i, k);
                    k++;
                }
            }
            try {
                sealer.unseal(tenant, epoch, pages, generations, done, k - done);
            } catch (RuntimeException | Error e) { // some pages may be plaintext whatever the sealer threw
                metrics.protectionFailed(count);
                throw new ProtectionException("unsealing " + (k - done) + " pages of tenant " + tenant + " (epoch " + epoch
                        + ") failed after " + done + " of " + count + " were unsealed; all " + count
                        + " are scrubbed and retired, nothing was reclaimed", e);
            }
            done = k;
        }
    }

    /**
     * Crypto-shreds a tenant: destroys its keys through the sealer, then makes every page it sealed
     * unreclaimable (one {@code SHRED} event each, with its epoch), including pages whose seal is
     * still being collected ({@link #add} records those shredded).
     *
     * @return the pages in the sealed set that became unrecoverable (not those still being collected)
     */
    public int shred(int tenant) {
        sealer.shred(tenant);
        shredded.set(tenant);
        int n = 0;
        for (int p = order.first(); p != -1; p = order.after(p)) {
            if (sealTenant[p] == tenant) {
                sealTenant[p] = -1;
                events.emit(PageEventType.SHRED, p, table.generation(p), tenant, Owners.NOBODY, sealEpoch[p]);
                n++;
            }
        }
        return n;
    }

    public long digest(long h) {
        for (int p = order.first(); p != -1; p = order.after(p)) {
            h = Digests.mix(h, sealTenant[p] * 31L + sealEpoch[p]);
        }
        return order.digest(h);
    }

    private static void swap(int[] a, int i, int j) {
        int t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}
