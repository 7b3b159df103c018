package dev.kvshield.perf.simulate;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.MemorySegment;

/**
 * A {@link ServingPool} over a {@link KvPagePool}: every guard on, the level's protection on release.
 * Ids are the pool's leases: a request holds {@code OWNER} leases, a cache namespace
 * {@code NAMESPACE} leases, a prefix reader its own {@code READER} leases.
 *
 * <p>Implementation notes: a reclaim names the leases a prefix held before its release, but a
 * sealed reference is computed from the page and generation of a live lease; so a release under a
 * sealing level remembers, per page, the lease it ended and that lease's generation, and a reclaim
 * of any other lease of the page answers "gone" (the page was handed out since).
 */
public final class ShieldedPool implements ServingPool {
    private final Level level;
    private final KvPagePool pool;
    private final long[] releasedLease;
    private final int[] releasedGeneration;
    private final long[] refs;
    private final int[] refIndex;
    private final long[] reclaimed;
    private final AutoCloseable attachments;
    private long allocatorNanos;

    /** @param attachments closed with the pool (e.g. COMPLIANCE's audit trail) */
    public ShieldedPool(Level level, KvPagePool pool, AutoCloseable attachments) {
        if (level.protection() != pool.config().level()) {
            throw new IllegalArgumentException("level " + level + " does not match the pool's level " + pool.config().level());
        }
        this.level = level;
        this.pool = pool;
        int pages = pool.geometry().pageCount();
        this.releasedLease = new long[pages];
        this.releasedGeneration = new int[pages];
        this.refs = new long[pages];
        this.refIndex = new int[pages];
        this.reclaimed = new long[pages];
        this.attachments = attachments;
    }

    public KvPagePool pool() {
        return pool;
    }

    @Override
    public Level level() {
        return level;
    }

    @Override
    public PageMemory memory() {
        return pool.memory();
    }

    @Override
    public void registerTenants(int count) {
        for (int t = pool.tenants().size(); t < count; t++) {
            pool.tenants().register("tenant-" + t);
        }
    }

    private static LeaseKind kindOf(long owner) {
        return Owners.isNamespace(owner) ? LeaseKind.NAMESPACE : LeaseKind.OWNER;
    }

    @Override
    public boolean allocate(int tenant, long owner, int count, long[] out, int offset) {
        long t0 = System.nanoTime();
        boolean ok = pool.allocate(tenant, owner, kindOf(owner), count, out, offset);
        allocatorNanos += System.nanoTime() - t0;
        return ok;
    }

    @Override
    public void release(int tenant, long owner, long[] handles, int count, boolean aborted) {
        long t0 = System.nanoTime();
        if (reclaimable(tenant)) {
            for (int i = 0; i < count; i++) {
                long handle = pool.view().handleOf(handles[i]);
                if (handle != PageHandles.NONE) {
                    releasedLease[PageHandles.page(handle)] = handles[i];
                    releasedGeneration[PageHandles.page(handle)] = PageHandles.generation(handle);
                }
            }
        }
        pool.release(tenant, owner, handles, 0, count, aborted ? ReleaseReason.ABORTED : ReleaseReason.FINISHED);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public void write(int tenant, long owner, long handle, int slot, MemorySegment[] srcByBuffer) {
        pool.writeAllBuffers(tenant, owner, handle, slot, srcByBuffer);
    }

    @Override
    public void read(int tenant, long reader, long handle, int slot, MemorySegment[] dstByBuffer) {
        pool.readAllBuffers(tenant, reader, handle, slot, dstByBuffer);
    }

    @Override
    public void addReaders(int tenant, long owner, long[] handles, int count, long reader, long[] readerOut) {
        long t0 = System.nanoTime();
        pool.share(tenant, owner, handles, 0, count, LeaseKind.READER, tenant, reader, readerOut, 0);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public void removeReaders(int tenant, long reader, long[] readerHandles, int count) {
        long t0 = System.nanoTime();
        pool.release(tenant, reader, readerHandles, 0, count, ReleaseReason.FINISHED);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public boolean reclaimable(int tenant) {
        return pool.protectionOf(tenant).seals();
    }

    @Override
    public int reclaim(int tenant, long owner, long[] releasedHandles, int count, long[] out) {
        long t0 = System.nanoTime();
        int k = 0;
        for (int i = 0; i < count; i++) {
            out[i] = LeaseIds.NONE;
            int page = pool.view().pageOf(releasedHandles[i]);
            if (page >= 0 && releasedLease[page] == releasedHandles[i]) {
                refs[k] = PageHandles.sealedReference(PageHandles.encode(page, releasedGeneration[page]));
                refIndex[k++] = i;
            }
        }
        int hits = pool.reclaim(tenant, owner, kindOf(owner), refs, 0, k, reclaimed, 0);
        allocatorNanos += System.nanoTime() - t0;
        for (int j = 0; j < k; j++) {
            out[refIndex[j]] = reclaimed[j];
        }
        return hits;
    }

    @Override
    public void watchSeals(SealWatcher watcher) {
        // SEAL is emitted once the backend confirmed the seal, before the page can be handed out again.
        pool.addListener((type, page, generation, tenant, owner, detail) -> {
            if (type == PageEventType.SEAL) {
                watcher.sealed(page, tenant);
            }
        });
    }

    @Override
    public int pageOf(long handle) {
        return pool.view().pageOf(handle);
    }

    @Override
    public int available() {
        return pool.available();
    }

    @Override
    public void endStep() {
        long t0 = System.nanoTime();
        pool.endStep();
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public long bytesProtected() {
        return (long) pool.metrics().bytesProtected(pool.config().level());
    }

    @Override
    public double protectionSeconds() {
        return pool.metrics().protectionSeconds(pool.config().level());
    }

    @Override
    public long allocatorNanos() {
        return allocatorNanos;
    }

    @Override
    public void close() {
        try {
            attachments.close();
        } catch (Exception e) {
            throw new IllegalStateException("closing " + level + " pool attachments failed: " + e.getMessage(), e);
        } finally {
            pool.close();
        }
    }
}
