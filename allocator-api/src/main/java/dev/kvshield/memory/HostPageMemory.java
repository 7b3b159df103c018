package dev.kvshield.memory;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A {@link PageMemory} over host memory segments, one per buffer. Subclasses decide where the
 * segments come from (allocated off-heap, or handed over by an engine).
 *
 * <p>Implementation notes: scrub is {@link MemorySegment#fill} per page region (about 1.5x a glibc
 * memset downcall on the same pages, see PERF-NOTES); verify-zero is a vectorised
 * {@link MemorySegment#mismatch} against one shared zero region as large as the largest page, so
 * neither allocates per call. {@link #scrubAndVerify} reads each region back right after zeroing
 * it, while it is still in the core's cache, instead of after the whole batch (a batch's pages
 * are megabytes; one region is a few tens of KiB): measured in the cost report, COMPLIANCE's
 * protection spent as long verifying as scrubbing before.
 */
public abstract class HostPageMemory implements PageMemory {
    private final PoolGeometry geometry;
    private final MemorySegment[] buffers;
    private final Arena zeroArena = Arena.ofShared();
    private final MemorySegment zeros;
    private volatile boolean closed;

    protected HostPageMemory(PoolGeometry geometry, MemorySegment[] buffers) {
        this.geometry = geometry;
        if (buffers.length != geometry.bufferCount()) {
            throw new InvalidGeometryException("geometry has " + geometry.bufferCount() + " buffers but " + buffers.length
                    + " regions were given");
        }
        long maxPage = 0;
        for (int b = 0; b < buffers.length; b++) {
            long need = geometry.bufferBytes(b);
            if (buffers[b].byteSize() < need) {
                throw new InvalidGeometryException(geometry.describeBuffer(b) + " has " + buffers[b].byteSize()
                        + " bytes; the geometry needs " + need + " (" + geometry.pageCount() + " pages x " + geometry.pageBytes(b)
                        + " bytes)");
            }
            maxPage = Math.max(maxPage, geometry.pageBytes(b));
        }
        checkDisjoint(geometry, buffers);
        this.buffers = buffers.clone();
        this.zeros = zeroArena.allocate(maxPage, 64);
    }

    /** {@link BufferRegions#checkDisjoint} over the native regions (a heap segment is its own array's). */
    private static void checkDisjoint(PoolGeometry geometry, MemorySegment[] buffers) {
        long[] starts = new long[buffers.length];
        for (int b = 0; b < buffers.length; b++) {
            if (!buffers[b].isNative()) {
                return;
            }
            starts[b] = buffers[b].address();
        }
        BufferRegions.checkDisjoint(geometry, starts);
    }

    @Override
    public final PoolGeometry geometry() {
        return geometry;
    }

    @Override
    public final boolean isHostAccessible() {
        return true;
    }

    @Override
    public final MemorySegment hostRegion(int page, int buffer) {
        checkOpen();
        geometry.checkPage(page);
        geometry.checkBuffer(buffer);
        long pageBytes = geometry.pageBytes(buffer);
        return buffers[buffer].asSlice(page * pageBytes, pageBytes);
    }

    @Override
    public void scrub(int[] pages, int offset, int count) {
        checkOpen();
        checkPages(pages, offset, count);
        for (int b = 0; b < buffers.length; b++) {
            for (int i = offset; i < offset + count; i++) {
                zero(pages[i], b);
            }
        }
    }

    /**
     * Scrubs and verifies region by region (each page of each buffer zeroed, then read back at once);
     * every region of every page is zeroed whatever an earlier one showed. Subclasses that replace
     * {@link #scrub} or {@link #verifyZero} replace this too.
     */
    @Override
    public int scrubAndVerify(int[] pages, int offset, int count, int[] dirtyOut) {
        checkOpen();
        checkPages(pages, offset, count);
        PageMemory.checkDirtyOut(dirtyOut, count);
        int dirty = 0;
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            boolean clean = true;
            for (int b = 0; b < buffers.length; b++) {
                zero(page, b);
                clean &= isZero(page, b);
            }
            if (!clean) {
                dirtyOut[dirty++] = page;
            }
        }
        return dirty;
    }

    @Override
    public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        checkOpen();
        checkPages(pages, offset, count);
        PageMemory.checkDirtyOut(dirtyOut, count);
        int dirty = 0;
        for (int i = offset; i < offset + count; i++) {
            int page = pages[i];
            for (int b = 0; b < buffers.length; b++) {
                if (!isZero(page, b)) {
                    dirtyOut[dirty++] = page;
                    break;
                }
            }
        }
        return dirty;
    }

    /**
     * Zeroes the region of {@code page} in buffer {@code b}; the caller checked both. A copy from the zero page, not a
     * slice's fill: a slice is an object per page and buffer, gone only where the JIT inlined the whole scrub.
     */
    private void zero(int page, int b) {
        long pageBytes = geometry.pageBytes(b);
        MemorySegment.copy(zeros, 0, buffers[b], page * pageBytes, pageBytes);
    }

    /** True if every byte of the region of {@code page} in buffer {@code b} is zero; the caller checked both. */
    private boolean isZero(int page, int b) {
        long pageBytes = geometry.pageBytes(b);
        long start = page * pageBytes;
        return MemorySegment.mismatch(buffers[b], start, start + pageBytes, zeros, 0, pageBytes) == -1;
    }

    @Override
    public void write(int page, int buffer, int slot, MemorySegment src) {
        checkOpen();
        long offset = geometry.slotByteOffset(page, buffer, slot, src.byteSize());
        MemorySegment.copy(src, 0, buffers[buffer], offset, src.byteSize());
    }

    @Override
    public void read(int page, int buffer, int slot, MemorySegment dst) {
        checkOpen();
        long offset = geometry.slotByteOffset(page, buffer, slot, dst.byteSize());
        MemorySegment.copy(buffers[buffer], offset, dst, 0, dst.byteSize());
    }

    /** The whole region of one buffer (tests and the simulator read raw bytes through it). */
    public final MemorySegment bufferRegion(int buffer) {
        checkOpen();
        geometry.checkBuffer(buffer);
        return buffers[buffer];
    }

    private void checkPages(int[] pages, int offset, int count) {
        if (offset < 0 || count < 0 || offset > pages.length - count) {
            throw new IllegalArgumentException("page list range [" + offset + ", " + ((long) offset + count)
                    + ") outside an array of " + pages.length);
        }
        for (int i = offset; i < offset + count; i++) {
            geometry.checkPage(pages[i]);
        }
    }

    protected final void checkOpen() {
        if (closed) {
            throw new IllegalStateException(describe() + " is closed");
        }
    }

    @Override
    public void close() {
        if (!closed) {
            closed = true;
            zeroArena.close();
            release();
        }
    }

    /** Frees what the subclass owns; called once from {@link #close()}. */
    protected abstract void release();
}
