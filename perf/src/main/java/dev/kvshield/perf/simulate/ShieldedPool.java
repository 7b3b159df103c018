package dev.kvshield.perf.simulate;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import java.lang.foreign.MemorySegment;

/** A {@link ServingPool} over a {@link KvPagePool}: every guard on, the level's protection on release. */
public final class ShieldedPool implements ServingPool {
    private final Level level;
    private final KvPagePool pool;
    private final long[] refs;
    private final AutoCloseable attachments;
    private long allocatorNanos;

    /** @param attachments closed with the pool (e.g. COMPLIANCE's audit trail) */
    public ShieldedPool(Level level, KvPagePool pool, AutoCloseable attachments) {
        if (level.protection() != pool.config().level()) {
            throw new IllegalArgumentException("level " + level + " does not match the pool's level " + pool.config().level());
        }
        this.level = level;
        this.pool = pool;
        this.refs = new long[pool.geometry().pageCount()];
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

    @Override
    public boolean allocate(int tenant, long owner, int count, long[] out, int offset) {
        long t0 = System.nanoTime();
        boolean ok = pool.allocate(tenant, owner, count, out, offset);
        allocatorNanos += System.nanoTime() - t0;
        return ok;
    }

    @Override
    public void release(int tenant, long owner, long[] handles, int count, boolean aborted) {
        long t0 = System.nanoTime();
        pool.release(tenant, owner, handles, 0, count, aborted ? ReleaseReason.ABORTED : ReleaseReason.FINISHED);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public void write(int tenant, long owner, long handle, int buffer, int slot, MemorySegment src) {
        pool.write(tenant, owner, handle, buffer, slot, src);
    }

    @Override
    public void read(int tenant, long reader, long handle, int buffer, int slot, MemorySegment dst) {
        pool.read(tenant, reader, handle, buffer, slot, dst);
    }

    @Override
    public void addReader(int tenant, long owner, long handle, long reader) {
        long t0 = System.nanoTime();
        pool.addReader(tenant, owner, handle, reader);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public void removeReader(int tenant, long owner, long handle, long reader) {
        long t0 = System.nanoTime();
        pool.removeReader(tenant, owner, handle, reader);
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public boolean reclaimable() {
        return pool.config().level() == ProtectionLevel.ENCRYPT;
    }

    @Override
    public int reclaim(int tenant, long owner, long[] releasedHandles, int count, long[] out) {
        long t0 = System.nanoTime();
        for (int i = 0; i < count; i++) {
            refs[i] = PageHandles.sealedReference(releasedHandles[i]);
        }
        int hits = pool.reclaim(tenant, owner, refs, 0, count, out, 0);
        allocatorNanos += System.nanoTime() - t0;
        return hits;
    }

    @Override
    public int pageOf(long handle) {
        return PageHandles.page(handle);
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
