package dev.kvshield.cuda;

import static dev.kvshield.cuda.CudaDevice.check;
import static dev.kvshield.cuda.CudaDevice.failure;
import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventQuery;
import static jcuda.driver.JCudaDriver.cuEventRecord;
import static jcuda.driver.JCudaDriver.cuEventSynchronize;
import static jcuda.driver.JCudaDriver.cuLaunchKernel;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemAllocHost;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemFreeHost;
import static jcuda.driver.JCudaDriver.cuMemGetAddressRange;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoHAsync;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoDAsync;
import static jcuda.driver.JCudaDriver.cuMemsetD32Async;
import static jcuda.driver.JCudaDriver.cuMemsetD8;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamSynchronize;
import static jcuda.driver.JCudaDriver.cuStreamWaitEvent;

import dev.kvshield.cuda.kernel.BatchStaging;
import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.cuda.kernel.KeySlots;
import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.BufferRegions;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.locks.ReentrantLock;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUevent_flags;
import jcuda.driver.CUfunction;
import jcuda.driver.CUresult;
import jcuda.driver.CUstream;
import jcuda.driver.CUstream_flags;

/**
 * A {@link PageMemory} in GPU memory, driven through JCuda's driver API: either device memory it
 * allocates itself ({@link #allocate}) or engine-owned device memory given as one raw device
 * address per buffer plus the engine's stream and events ({@link #wrap}).
 *
 * <p>Each batch call ({@link #scrub}, {@link #verifyZero}, {@link #chacha20Xor}) is one fused
 * kernel launch covering every listed page in every buffer. Ordering: the backend's own stream
 * first waits ({@code cuStreamWaitEvent}) on a fence it records on the engine's stream at the call
 * and on each event the engine registered for its other streams (the engine re-records them after
 * its launches each step), so a kernel never overtakes engine work still queued on a page being
 * released. After the kernel the backend records its completion event, waits for it, and returns
 * only once {@code cuEventQuery} reports it complete: what the pool gets is a synchronous call
 * whose normal return means "done on the device", so pages return to FREE at the pool's next step
 * boundary only after confirmed completion. Any failure throws {@link CudaException} (a
 * {@link dev.kvshield.protection.ProtectionException}) and the pool keeps the pages out.
 *
 * <p>Thread-safe: batch calls serialise on one lock (one staging area, one stream). Every call
 * makes the device's primary context current on its thread first.
 *
 * <p>Implementation notes: the batch's page list goes through pinned host staging to device
 * staging (one async copy), the kernels' parameter blocks are built once and reused, so the batch
 * path allocates nothing in Java. The buffer table (base address and page size per buffer) is
 * uploaded once. Keys for {@link #chacha20Xor} live only in the launch's by-value parameter block,
 * wiped right after the launch call (the driver copies parameters at launch).
 */
public final class CudaPageMemory implements PageKeystreamXor {
    private static final long ALLOCATION_ALIGNMENT = 256;

    private final CudaDevice device;
    private final PoolGeometry geometry;
    private final long[] bases;
    private final CUdeviceptr ownedBlock;
    private final CUdeviceptr basesTable = new CUdeviceptr();
    private final CUdeviceptr pageBytesTable = new CUdeviceptr();
    private final CUstream stream = new CUstream();
    private final CUevent done = new CUevent();
    private final CUstream engineStream;
    private final CUevent engineFence = new CUevent();
    private final CUevent[] engineEvents;
    private final int scrubUnits;
    private final int chachaUnits;
    private final ReentrantLock lock = new ReentrantLock();

    // Staging, guarded by lock.
    private final CUdeviceptr deviceEntries = new CUdeviceptr();
    private final CUdeviceptr deviceFlags = new CUdeviceptr();
    private final Pointer hostEntriesPointer = new Pointer();
    private final Pointer hostFlagsPointer = new Pointer();
    private final Pointer hostIoPointer = new Pointer();
    private final MemorySegment hostIo;
    private final KeySlots keySlots = new KeySlots();
    private final int[] countParam = new int[1];
    private final long[] seenScratch;
    private int capacity;
    private MemorySegment hostEntries;
    private MemorySegment hostFlags;
    private Pointer scrubParams;
    private Pointer verifyParams;
    private Pointer chachaParams;
    private long launches;
    private volatile boolean closed;

    private CudaPageMemory(CudaDevice device, PoolGeometry geometry, long[] bases, CUdeviceptr ownedBlock,
            CUstream engineStream, CUevent[] engineEvents) {
        this.device = device;
        this.geometry = geometry;
        this.bases = bases.clone();
        this.ownedBlock = ownedBlock;
        this.engineStream = engineStream;
        this.engineEvents = engineEvents;
        this.scrubUnits = KernelAbi.unitsPerRegion(geometry, KernelAbi.SCRUB_UNIT_BYTES);
        this.chachaUnits = KernelAbi.unitsPerRegion(geometry, KernelAbi.CHACHA_BLOCK_BYTES);
        this.seenScratch = new long[(geometry.pageCount() + 63) / 64];
        device.makeCurrent();
        try {
            check(cuStreamCreate(stream, CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate");
            check(cuEventCreate(done, CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate(completion)");
            if (engineStream != null) {
                check(cuEventCreate(engineFence, CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate(engine fence)");
            }
            int n = geometry.bufferCount();
            check(cuMemAlloc(basesTable, 8L * n), "cuMemAlloc(buffer table, " + 8L * n + " bytes)");
            check(cuMemcpyHtoD(basesTable, Pointer.to(this.bases), 8L * n), "cuMemcpyHtoD(buffer table)");
            check(cuMemAlloc(pageBytesTable, 4L * n), "cuMemAlloc(page size table, " + 4L * n + " bytes)");
            check(cuMemcpyHtoD(pageBytesTable, Pointer.to(KernelAbi.pageBytesTable(geometry)), 4L * n),
                    "cuMemcpyHtoD(page size table)");
            long maxPageBytes = (long) scrubUnits * KernelAbi.SCRUB_UNIT_BYTES;
            check(cuMemAllocHost(hostIoPointer, maxPageBytes), "cuMemAllocHost(" + maxPageBytes + " bytes)");
            this.hostIo = MemorySegment.ofBuffer(hostIoPointer.getByteBuffer(0, maxPageBytes));
            ensureCapacity(geometry.pageCount());
        } catch (RuntimeException e) {
            freeAll();
            throw e;
        }
    }

    /**
     * Allocates zero-filled device memory for every buffer of {@code geometry} on {@code device}
     * (standalone use and benchmarks); {@link #close()} frees it.
     */
    public static CudaPageMemory allocate(CudaDevice device, PoolGeometry geometry) {
        device.makeCurrent();
        long[] offsets = new long[geometry.bufferCount()];
        long total = 0;
        for (int b = 0; b < offsets.length; b++) {
            offsets[b] = total;
            total += (geometry.bufferBytes(b) + ALLOCATION_ALIGNMENT - 1) / ALLOCATION_ALIGNMENT * ALLOCATION_ALIGNMENT;
        }
        CUdeviceptr block = new CUdeviceptr();
        check(cuMemAlloc(block, total), "cuMemAlloc(" + total + " bytes for " + offsets.length + " buffers)");
        try {
            check(cuMemsetD8(block, (byte) 0, total), "cuMemsetD8(" + total + " bytes)");
        } catch (RuntimeException e) {
            cuMemFree(block);
            throw e;
        }
        long base = RawHandles.address(block);
        for (int b = 0; b < offsets.length; b++) {
            offsets[b] += base;
        }
        return new CudaPageMemory(device, geometry, offsets, block, null, new CUevent[0]); // frees block if it fails
    }

    /**
     * Wraps engine-owned device memory, one region per buffer in global buffer order, and the
     * engine's ordering handles: {@code engineStreamHandle} is the stream the engine runs its
     * forward pass on ({@code 0} is the legacy default stream), {@code engineEventHandles} one
     * event per further engine stream, which the engine re-records after its launches on that
     * stream every step. The caller keeps memory, stream and events alive until {@link #close()};
     * closing frees none of them.
     *
     * @throws InvalidGeometryException if the counts differ, an address is not 16-byte aligned,
     *     or a region is smaller than the geometry needs or not inside one device allocation
     *     (messages name the values)
     */
    public static CudaPageMemory wrap(CudaDevice device, PoolGeometry geometry, long[] deviceAddresses, long[] byteSizes,
            long engineStreamHandle, long[] engineEventHandles) {
        if (deviceAddresses.length != geometry.bufferCount() || byteSizes.length != geometry.bufferCount()) {
            throw new InvalidGeometryException("geometry has " + geometry.bufferCount() + " buffers but "
                    + deviceAddresses.length + " addresses and " + byteSizes.length + " sizes were given");
        }
        device.makeCurrent();
        for (int b = 0; b < deviceAddresses.length; b++) {
            KernelAbi.checkBase(b, deviceAddresses[b]);
            long need = geometry.bufferBytes(b);
            if (byteSizes[b] < need) {
                throw new InvalidGeometryException(geometry.describeBuffer(b) + " has " + byteSizes[b]
                        + " bytes; the geometry needs " + need);
            }
            checkInsideOneAllocation(b, deviceAddresses[b], need);
        }
        BufferRegions.checkDisjoint(geometry, deviceAddresses);
        CUevent[] events = new CUevent[engineEventHandles.length];
        for (int i = 0; i < events.length; i++) {
            events[i] = RawHandles.event(engineEventHandles[i]);
        }
        return new CudaPageMemory(device, geometry, deviceAddresses, null, RawHandles.stream(engineStreamHandle), events);
    }

    private static void checkInsideOneAllocation(int buffer, long address, long bytes) {
        CUdeviceptr allocationBase = new CUdeviceptr();
        long[] allocationBytes = new long[1];
        int r = cuMemGetAddressRange(allocationBase, allocationBytes, new CUdeviceptr().withByteOffset(address));
        if (r != CUresult.CUDA_SUCCESS) {
            throw new InvalidGeometryException("buffer " + buffer + " address 0x" + Long.toHexString(address)
                    + " is not device memory of this context (" + CUresult.stringFor(r) + ")");
        }
        long start = RawHandles.address(allocationBase);
        if (address + bytes > start + allocationBytes[0]) {
            throw new InvalidGeometryException("buffer " + buffer + " needs " + bytes + " bytes from 0x"
                    + Long.toHexString(address) + " but its allocation ends after " + (start + allocationBytes[0] - address));
        }
    }

    @Override
    public PoolGeometry geometry() {
        return geometry;
    }

    @Override
    public void scrub(int[] pages, int offset, int count) {
        lock.lock();
        try {
            if (enqueueScrub(pages, offset, count)) {
                complete("scrub of pages", count);
            }
        } finally {
            lock.unlock();
        }
    }

    @Override
    public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        PageMemory.checkDirtyOut(dirtyOut, count);
        lock.lock();
        try {
            if (!enqueueVerifyZero(pages, offset, count)) {
                return 0;
            }
            complete("verify-zero of pages", count);
            return BatchStaging.collectDirty(hostFlags, pages, offset, count, dirtyOut);
        } finally {
            lock.unlock();
        }
    }

    @Override
    public void chacha20Xor(int[] pages, int[] generations, byte[] keySlots, int offset, int count, int keyCount,
            KeyLoader keys) {
        lock.lock();
        try {
            if (enqueueChacha20Xor(pages, generations, keySlots, offset, count, keyCount, keys)) {
                complete("chacha20-xor of pages", count);
            }
        } finally {
            lock.unlock();
        }
    }

    // The enqueue half of each batch call: checks, stages the list and launches on the backend's
    // stream without waiting; false for an empty batch (nothing enqueued). Package-private: the GPU
    // benchmarks time back-to-back launches with events on stream(); callers of the public methods
    // always wait for confirmed completion.

    boolean enqueueScrub(int[] pages, int offset, int count) {
        lock.lock();
        try {
            if (!stagePageList(pages, offset, count)) {
                return false;
            }
            launch(device.scrubFunction(), count, scrubUnits, scrubParams, "scrub");
            return true;
        } finally {
            lock.unlock();
        }
    }

    boolean enqueueVerifyZero(int[] pages, int offset, int count) {
        lock.lock();
        try {
            if (!stagePageList(pages, offset, count)) {
                return false;
            }
            check(cuMemsetD32Async(deviceFlags, 0, count, stream), "cuMemsetD32Async(dirty flags)");
            launch(device.verifyZeroFunction(), count, scrubUnits, verifyParams, "verify-zero");
            check(cuMemcpyDtoHAsync(hostFlagsPointer, deviceFlags, 4L * count, stream), "cuMemcpyDtoHAsync(dirty flags)");
            return true;
        } finally {
            lock.unlock();
        }
    }

    boolean enqueueChacha20Xor(int[] pages, int[] generations, byte[] keySlots, int offset, int count, int keyCount,
            KeyLoader keys) {
        lock.lock();
        try {
            checkOpen();
            if (count == 0) {
                KernelAbi.checkPages(geometry, pages, offset, count);
                return false;
            }
            KernelAbi.checkSealBatch(geometry, pages, generations, keySlots, offset, count, keyCount, seenScratch);
            beginBatch(count);
            long bytes = BatchStaging.stageSeal(hostEntries, pages, generations, keySlots, offset, count);
            check(cuMemcpyHtoDAsync(deviceEntries, hostEntriesPointer, bytes, stream), "cuMemcpyHtoDAsync(seal list)");
            try {
                keys.load(this.keySlots);
                launch(device.chacha20XorFunction(), count, chachaUnits, chachaParams, "chacha20-xor");
            } finally {
                this.keySlots.wipe();
            }
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** The backend's own stream (the GPU benchmarks record timing events on it). */
    CUstream stream() {
        return stream;
    }

    @Override
    public void write(int page, int buffer, int slot, MemorySegment src) {
        checkOpen();
        long at = geometry.slotByteOffset(page, buffer, slot, src.byteSize());
        lock.lock();
        try {
            beginBatch(0);
            MemorySegment.copy(src, 0, hostIo, 0, src.byteSize());
            check(cuMemcpyHtoDAsync(new CUdeviceptr().withByteOffset(bases[buffer] + at), hostIoPointer, src.byteSize(), stream),
                    "cuMemcpyHtoDAsync(page " + page + " buffer " + buffer + ")");
            complete("write of page " + page + " buffer " + buffer, 1);
        } finally {
            lock.unlock();
        }
    }

    @Override
    public void read(int page, int buffer, int slot, MemorySegment dst) {
        checkOpen();
        long at = geometry.slotByteOffset(page, buffer, slot, dst.byteSize());
        lock.lock();
        try {
            beginBatch(0);
            check(cuMemcpyDtoHAsync(hostIoPointer, new CUdeviceptr().withByteOffset(bases[buffer] + at), dst.byteSize(), stream),
                    "cuMemcpyDtoHAsync(page " + page + " buffer " + buffer + ")");
            complete("read of page " + page + " buffer " + buffer, 1);
            MemorySegment.copy(hostIo, 0, dst, 0, dst.byteSize());
        } finally {
            lock.unlock();
        }
    }

    /** Kernel launches made so far (the GPU check asserts one per batch call). */
    public long launchCount() {
        lock.lock();
        try {
            return launches;
        } finally {
            lock.unlock();
        }
    }

    /** Device address of buffer {@code buffer} (benchmarks compare against plain driver calls on it). */
    public long bufferAddress(int buffer) {
        geometry.checkBuffer(buffer);
        return bases[buffer];
    }

    public CudaDevice device() {
        return device;
    }

    @Override
    public String describe() {
        return "CUDA device memory on " + device.name() + " (" + (ownedBlock != null ? "own" : "engine-owned") + ", "
                + geometry.bufferCount() + " buffers, " + geometry.pageCount() + " pages)";
    }

    @Override
    public void close() {
        lock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            device.makeCurrent();
            cuStreamSynchronize(stream);
            freeAll();
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- internals (under lock)

    /** Frees whatever this backend created (handles still 0 were never created); not the engine's memory. */
    private void freeAll() {
        for (CUdeviceptr p : new CUdeviceptr[] {deviceEntries, deviceFlags, basesTable, pageBytesTable, ownedBlock}) {
            if (p != null && RawHandles.address(p) != 0) {
                cuMemFree(p);
            }
        }
        for (Pointer p : new Pointer[] {hostEntriesPointer, hostFlagsPointer, hostIoPointer}) {
            if (RawHandles.address(p) != 0) {
                cuMemFreeHost(p);
            }
        }
        for (CUevent e : new CUevent[] {engineFence, done}) {
            if (RawHandles.address(e) != 0) {
                cuEventDestroy(e);
            }
        }
        if (RawHandles.address(stream) != 0) {
            cuStreamDestroy(stream);
        }
        keySlots.close();
    }

    /** Checks a page list, orders the stream after the engine and copies the list to the device; false if empty. */
    private boolean stagePageList(int[] pages, int offset, int count) {
        checkOpen();
        KernelAbi.checkPages(geometry, pages, offset, count);
        if (count == 0) {
            return false;
        }
        beginBatch(count);
        long bytes = BatchStaging.stagePages(hostEntries, pages, offset, count);
        check(cuMemcpyHtoDAsync(deviceEntries, hostEntriesPointer, bytes, stream), "cuMemcpyHtoDAsync(page list)");
        return true;
    }

    /** Makes the context current, grows staging if needed and orders the stream after the engine. */
    private void beginBatch(int count) {
        device.makeCurrent();
        ensureCapacity(count);
        if (engineStream != null) {
            check(cuEventRecord(engineFence, engineStream), "cuEventRecord(fence on the engine stream)");
            check(cuStreamWaitEvent(stream, engineFence, 0), "cuStreamWaitEvent(engine stream fence)");
        }
        for (int i = 0; i < engineEvents.length; i++) {
            int r = cuStreamWaitEvent(stream, engineEvents[i], 0);
            if (r != CUresult.CUDA_SUCCESS) {
                throw failure(r, "cuStreamWaitEvent(engine event " + i + ")");
            }
        }
    }

    private void launch(CUfunction function, int count, int unitsPerRegion, Pointer params, String what) {
        countParam[0] = count;
        int blocks = KernelAbi.blocks(KernelAbi.totalUnits(geometry, count, unitsPerRegion), device.maxBlocks());
        int r = cuLaunchKernel(function, blocks, 1, 1, KernelAbi.THREADS_PER_BLOCK, 1, 1, 0, stream, params, null);
        if (r != CUresult.CUDA_SUCCESS) {
            throw failure(r, "cuLaunchKernel(" + what + ", " + count + " pages, " + blocks + " blocks)");
        }
        launches++;
    }

    /**
     * Records the completion event, waits for it and confirms it complete; never assumes. {@code what}
     * and {@code count} name the batch in a failure message (built only on failure).
     */
    private void complete(String what, int count) {
        int r = cuEventRecord(done, stream);
        if (r == CUresult.CUDA_SUCCESS) {
            r = cuEventSynchronize(done);
        }
        if (r != CUresult.CUDA_SUCCESS) {
            throw failure(r, what + ", batch of " + count);
        }
        int status = cuEventQuery(done);
        if (status != CUresult.CUDA_SUCCESS) {
            throw new CudaException(what + ", batch of " + count + ": completion event not confirmed complete ("
                    + CUresult.stringFor(status) + ")");
        }
    }

    private void ensureCapacity(int count) {
        if (count <= capacity) {
            return;
        }
        int newCapacity = Math.max(count, capacity * 2);
        if (capacity > 0) {
            cuMemFree(deviceEntries);
            cuMemFree(deviceFlags);
            cuMemFreeHost(hostEntriesPointer);
            cuMemFreeHost(hostFlagsPointer);
            capacity = 0;
        }
        long entryBytes = BatchStaging.sealEntryBytes(newCapacity);
        long flagBytes = 4L * newCapacity;
        check(cuMemAlloc(deviceEntries, entryBytes), "cuMemAlloc(page list staging, " + entryBytes + " bytes)");
        check(cuMemAlloc(deviceFlags, flagBytes), "cuMemAlloc(dirty flags, " + flagBytes + " bytes)");
        check(cuMemAllocHost(hostEntriesPointer, entryBytes), "cuMemAllocHost(page list staging)");
        check(cuMemAllocHost(hostFlagsPointer, flagBytes), "cuMemAllocHost(dirty flags)");
        hostEntries = MemorySegment.ofBuffer(hostEntriesPointer.getByteBuffer(0, entryBytes));
        hostFlags = MemorySegment.ofBuffer(hostFlagsPointer.getByteBuffer(0, flagBytes));
        capacity = newCapacity;
        int[] bufferCount = {geometry.bufferCount()};
        scrubParams = Pointer.to(Pointer.to(basesTable), Pointer.to(pageBytesTable), Pointer.to(bufferCount),
                Pointer.to(deviceEntries), Pointer.to(countParam), Pointer.to(new int[] {scrubUnits}));
        verifyParams = Pointer.to(Pointer.to(basesTable), Pointer.to(pageBytesTable), Pointer.to(bufferCount),
                Pointer.to(deviceEntries), Pointer.to(countParam), Pointer.to(new int[] {scrubUnits}),
                Pointer.to(deviceFlags));
        chachaParams = Pointer.to(Pointer.to(basesTable), Pointer.to(pageBytesTable), Pointer.to(bufferCount),
                Pointer.to(deviceEntries), Pointer.to(countParam), Pointer.to(new int[] {chachaUnits}),
                Pointer.to(keySlots.block().asByteBuffer()));
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException(describe() + " is closed");
        }
    }
}
