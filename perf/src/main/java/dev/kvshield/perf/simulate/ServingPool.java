package dev.kvshield.perf.simulate;

import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;

/**
 * The page pool as the simulated engine sees it: the calls a scheduler makes, with handles as
 * {@code long}s and owners as {@link dev.kvshield.tenant.Owners} references. {@link StockPool} does
 * what SGLang's allocator does and nothing more; {@link ShieldedPool} runs a {@link
 * dev.kvshield.pool.KvPagePool}. Called from the simulation thread only.
 */
public interface ServingPool extends AutoCloseable {
    Level level();

    PageMemory memory();

    /** Registers the tenants {@code 0 .. count-1}. */
    void registerTenants(int count);

    /** All-or-nothing allocation into {@code out[offset .. offset+count)}; false when the pool cannot give them. */
    boolean allocate(int tenant, long owner, int count, long[] out, int offset);

    void release(int tenant, long owner, long[] handles, int count, boolean aborted);

    void write(int tenant, long owner, long handle, int buffer, int slot, MemorySegment src);

    void read(int tenant, long reader, long handle, int buffer, int slot, MemorySegment dst);

    void addReader(int tenant, long owner, long handle, long reader);

    void removeReader(int tenant, long owner, long handle, long reader);

    /**
     * True if released pages can be reclaimed by their tenant for a prefix hit (ENCRYPT): then
     * {@link #reclaim} may hand them back with their content.
     */
    boolean reclaimable();

    /**
     * Reclaims pages released earlier by {@code tenant}, given their handles before release; writes
     * new handles (or 0 for "gone") into {@code out}.
     *
     * @return pages reclaimed
     */
    int reclaim(int tenant, long owner, long[] releasedHandles, int count, long[] out);

    /** The page index of a handle. */
    int pageOf(long handle);

    /** Pages an allocation can have now. */
    int available();

    /** The scheduler step boundary. */
    void endStep();

    /** Bytes the pool protected (scrubbed, sealed, verified) so far. */
    long bytesProtected();

    /** Seconds the pool spent protecting so far. */
    double protectionSeconds();

    /**
     * Nanoseconds spent so far inside this pool's allocator calls: {@link #allocate}, {@link
     * #release}, {@link #reclaim}, {@link #addReader}, {@link #removeReader} and {@link #endStep}
     * (bookkeeping, synchronous protection, the audit flush), host clock around each call. Not
     * {@link #read} and {@link #write}: moving KV is the model's work, which an engine's kernels do
     * without the allocator.
     */
    long allocatorNanos();

    /** Releases the pool's resources; the memory stays open. */
    @Override
    void close();
}
