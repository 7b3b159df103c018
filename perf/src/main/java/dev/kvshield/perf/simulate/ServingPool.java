package dev.kvshield.perf.simulate;

import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;

/**
 * The page pool as the simulated engine sees it: the calls a scheduler makes, with the ids it
 * holds pages by as {@code long}s (kvshield's leases, the stock pool's page ids) and owners as
 * {@link dev.kvshield.tenant.Owners} references. {@link StockPool} does
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

    /**
     * Writes token slots from {@code slot} of every buffer of a page, {@code srcByBuffer[b]} into
     * buffer {@code b} (the same number of tokens in each), as a forward pass writes a page's layers.
     */
    void write(int tenant, long owner, long handle, int slot, MemorySegment[] srcByBuffer);

    /** Reads token slots from {@code slot} of every buffer of a page into {@code dstByBuffer}, as attention reads a page's layers. */
    void read(int tenant, long reader, long handle, int slot, MemorySegment[] dstByBuffer);

    /**
     * Lets {@code reader} (a request of {@code tenant}) read the pages {@code owner} holds by
     * {@code handles[0 .. count)}; writes the id the reader reads each page through into
     * {@code readerOut}.
     */
    void addReaders(int tenant, long owner, long[] handles, int count, long reader, long[] readerOut);

    /** Ends the reads {@link #addReaders} allowed, given the reader's ids. */
    void removeReaders(int tenant, long reader, long[] readerHandles, int count);

    /**
     * True if pages {@code tenant} releases can be reclaimed by it for a prefix hit (ENCRYPT): then
     * {@link #reclaim} may hand them back with their content.
     */
    boolean reclaimable(int tenant);

    /**
     * Reclaims pages released earlier by {@code tenant}, given the ids they were held by before the
     * release; writes new ids (or 0 for "gone") into {@code out}.
     *
     * @return pages reclaimed
     */
    int reclaim(int tenant, long owner, long[] releasedHandles, int count, long[] out);

    /** The page index of an id, held or released. */
    int pageOf(long handle);

    /**
     * Calls {@code watcher} each time the seal of a released page completes (the page is sealed and
     * not yet handed out), on the thread whose call to this pool completed it. A pool that never seals
     * never calls it.
     */
    default void watchSeals(SealWatcher watcher) {}

    /** Told of each completed seal: the page index and the tenant it was sealed for. */
    @FunctionalInterface
    interface SealWatcher {
        void sealed(int page, int tenant);
    }

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
     * (bookkeeping, synchronous protection, the audit trail's hand-off or write), host clock around each call. Not
     * {@link #read} and {@link #write}: moving KV is the model's work, which an engine's kernels do
     * without the allocator.
     */
    long allocatorNanos();

    /** Releases the pool's resources; the memory stays open. */
    @Override
    void close();
}
