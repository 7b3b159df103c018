package dev.kvshield.perf.simulate;

import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;

/**
 * The yardstick: a plain shared pool modelled on SGLang's paged allocator. A LIFO free list of page
 * ids (freed pages are prepended and reused first, in their order), page 0 reserved, no scrub, no
 * generations, no owners, no claims, no handoff or admission checks: a handle is the page id and
 * any holder may read or write any page. It runs on the same {@link PageMemory} as the kvshield
 * pools, so stale bytes really are there to be read.
 */
public final class StockPool implements ServingPool {
    private final PageMemory memory;
    private final int[] free;
    private int freeCount;
    private long allocatorNanos;

    /** Builds the pool over {@code memory}, zeroing it once as SGLang zeroes its buffers at start. */
    public StockPool(PageMemory memory) {
        this.memory = memory;
        int pages = memory.geometry().pageCount();
        int[] all = new int[pages];
        for (int p = 0; p < pages; p++) {
            all[p] = p;
        }
        memory.scrub(all, 0, pages);
        int first = memory.geometry().firstUsablePage();
        free = new int[pages];
        for (int p = pages - 1; p >= first; p--) {
            free[freeCount++] = p;
        }
    }

    @Override
    public Level level() {
        return Level.STOCK;
    }

    @Override
    public PageMemory memory() {
        return memory;
    }

    @Override
    public void registerTenants(int count) {
        // SGLang's allocator knows no tenants.
    }

    @Override
    public boolean allocate(int tenant, long owner, int count, long[] out, int offset) {
        long t0 = System.nanoTime();
        boolean ok = count <= freeCount;
        if (ok) {
            for (int i = 0; i < count; i++) {
                out[offset + i] = free[--freeCount];
            }
        }
        allocatorNanos += System.nanoTime() - t0;
        return ok;
    }

    @Override
    public void release(int tenant, long owner, long[] handles, int count, boolean aborted) {
        long t0 = System.nanoTime();
        for (int i = count - 1; i >= 0; i--) {
            free[freeCount++] = (int) handles[i];
        }
        allocatorNanos += System.nanoTime() - t0;
    }

    @Override
    public void write(int tenant, long owner, long handle, int slot, MemorySegment[] srcByBuffer) {
        for (int b = 0; b < srcByBuffer.length; b++) {
            memory.write((int) handle, b, slot, srcByBuffer[b]);
        }
    }

    @Override
    public void read(int tenant, long reader, long handle, int slot, MemorySegment[] dstByBuffer) {
        for (int b = 0; b < dstByBuffer.length; b++) {
            memory.read((int) handle, b, slot, dstByBuffer[b]);
        }
    }

    @Override
    public void addReaders(int tenant, long owner, long[] handles, int count, long reader, long[] readerOut) {
        System.arraycopy(handles, 0, readerOut, 0, count); // no ownership to extend: readers use the page id
    }

    @Override
    public void removeReaders(int tenant, long reader, long[] readerHandles, int count) {
        // No ownership to shrink.
    }

    @Override
    public boolean reclaimable(int tenant) {
        return false;
    }

    @Override
    public int reclaim(int tenant, long owner, long[] releasedHandles, int count, long[] out) {
        throw new UnsupportedOperationException("the stock pool has no sealed pages to reclaim");
    }

    @Override
    public int pageOf(long handle) {
        return (int) handle;
    }

    @Override
    public int available() {
        return freeCount;
    }

    @Override
    public void endStep() {
        // Freed pages are available at once.
    }

    @Override
    public long bytesProtected() {
        return 0;
    }

    @Override
    public double protectionSeconds() {
        return 0;
    }

    /** Only allocate and release do work here; the no-op calls take no time worth a clock read. */
    @Override
    public long allocatorNanos() {
        return allocatorNanos;
    }

    @Override
    public void close() {
        // Nothing beyond the memory, which the caller owns.
    }
}
