package dev.kvshield.cuda;

import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.cuda.kernel.BatchStaging;
import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.cuda.kernel.KeySlots;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.HostPageMemory;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Host memory whose batch operations run the kernels' host build with the same launch arguments
 * as {@link CudaPageMemory}: the backend the CPU tests compare byte for byte with the CPU backend.
 * The grid shape is chosen per instance so tests cover the grid-stride loop at many shapes.
 */
final class HostKernelPageMemory extends HostPageMemory implements PageKeystreamXor {
    private final Arena arena;
    private final KernelLauncher launcher;
    private final int maxBlocks;
    private final int threads;
    private final MemorySegment bases;
    private final MemorySegment pageBytes;
    private final int scrubUnits;
    private final int chachaUnits;
    private final long[] seenScratch;
    private final KeySlots keySlots = new KeySlots();
    private MemorySegment entries;
    private MemorySegment flags;

    private HostKernelPageMemory(PoolGeometry g, Arena arena, MemorySegment[] buffers, KernelLauncher launcher, int maxBlocks,
            int threads) {
        super(g, buffers);
        this.arena = arena;
        this.launcher = launcher;
        this.maxBlocks = maxBlocks;
        this.threads = threads;
        this.bases = arena.allocate(ValueLayout.JAVA_LONG, g.bufferCount());
        for (int b = 0; b < buffers.length; b++) {
            KernelAbi.checkBase(b, buffers[b].address());
            bases.setAtIndex(ValueLayout.JAVA_LONG, b, buffers[b].address());
        }
        this.pageBytes = arena.allocateFrom(ValueLayout.JAVA_INT, KernelAbi.pageBytesTable(g));
        this.scrubUnits = KernelAbi.unitsPerRegion(g, KernelAbi.SCRUB_UNIT_BYTES);
        this.chachaUnits = KernelAbi.unitsPerRegion(g, KernelAbi.CHACHA_BLOCK_BYTES);
        this.seenScratch = new long[(g.pageCount() + 63) / 64];
    }

    /** Zero-filled host memory for {@code g}, launching through {@code launcher} on grids of at most {@code maxBlocks} x {@code threads}. */
    static HostKernelPageMemory allocate(PoolGeometry g, KernelLauncher launcher, int maxBlocks, int threads) {
        Arena arena = Arena.ofShared();
        MemorySegment[] buffers = new MemorySegment[g.bufferCount()];
        for (int b = 0; b < buffers.length; b++) {
            buffers[b] = arena.allocate(g.bufferBytes(b), 64);
        }
        return new HostKernelPageMemory(g, arena, buffers, launcher, maxBlocks, threads);
    }

    @Override
    public synchronized void scrub(int[] pages, int offset, int count) {
        checkOpen();
        KernelAbi.checkPages(geometry(), pages, offset, count);
        if (count == 0) {
            return;
        }
        ensureCapacity(count);
        BatchStaging.stagePages(entries, pages, offset, count);
        launcher.scrub(blocks(count, scrubUnits), threads, bases, pageBytes, geometry().bufferCount(), entries, count,
                scrubUnits);
    }

    /** As the device backend does it: the scrub kernel, then the verify kernel (not the host memory's fused loop). */
    @Override
    public synchronized int scrubAndVerify(int[] pages, int offset, int count, int[] dirtyOut) {
        PageMemory.checkDirtyOut(dirtyOut, count);
        scrub(pages, offset, count);
        return verifyZero(pages, offset, count, dirtyOut);
    }

    @Override
    public synchronized int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        checkOpen();
        KernelAbi.checkPages(geometry(), pages, offset, count);
        PageMemory.checkDirtyOut(dirtyOut, count);
        if (count == 0) {
            return 0;
        }
        ensureCapacity(count);
        BatchStaging.stagePages(entries, pages, offset, count);
        flags.fill((byte) 0);
        launcher.verifyZero(blocks(count, scrubUnits), threads, bases, pageBytes, geometry().bufferCount(), entries, count,
                scrubUnits, flags);
        return BatchStaging.collectDirty(flags, pages, offset, count, dirtyOut);
    }

    /** The host-build twin of {@link CudaPageMemory#chacha20Xor}. */
    @Override
    public synchronized void chacha20Xor(int[] pages, int[] generations, byte[] slots, int offset, int count, int keyCount,
            PageKeystreamXor.KeyLoader keys) {
        checkOpen();
        if (count == 0) {
            KernelAbi.checkPages(geometry(), pages, offset, count);
            return;
        }
        KernelAbi.checkSealBatch(geometry(), pages, generations, slots, offset, count, keyCount, seenScratch);
        ensureCapacity(count);
        BatchStaging.stageSeal(entries, pages, generations, slots, offset, count);
        try {
            keys.load(keySlots);
            launcher.chacha20Xor(blocks(count, chachaUnits), threads, bases, pageBytes, geometry().bufferCount(), entries,
                    count, chachaUnits, keySlots.block());
        } finally {
            keySlots.wipe();
        }
    }

    private int blocks(int count, int units) {
        long total = KernelAbi.totalUnits(geometry(), count, units);
        return (int) Math.max(1, Math.min((total + threads - 1) / threads, maxBlocks));
    }

    private void ensureCapacity(int count) {
        if (entries == null || flags.byteSize() < 4L * count) {
            entries = arena.allocate(BatchStaging.sealEntryBytes(count), 16);
            flags = arena.allocate(4L * count, 16);
        }
    }

    @Override
    public String describe() {
        return "host build of the CUDA kernels (" + geometry().bufferCount() + " buffers, " + geometry().pageCount()
                + " pages, grids of up to " + maxBlocks + " x " + threads + ")";
    }

    @Override
    protected void release() {
        keySlots.close();
        arena.close();
    }
}
