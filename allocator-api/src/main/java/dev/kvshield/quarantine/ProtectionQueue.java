package dev.kvshield.quarantine;

import dev.kvshield.internal.Digests;

/**
 * Protection batches in submission order: page ids (with their generations) in one ring, batch
 * descriptors in another, both sized so every quarantined page fits at once. Submission and
 * collection happen under the pool lock; in asynchronous mode one worker thread executes batches in
 * order without the pool lock, synchronising with the pool through this queue's monitor.
 *
 * <p>Implementation notes: a page is in the ring at most once (it enters when it becomes
 * protectable and leaves when its batch is collected), so capacity {@code pageCount} never
 * overflows; batches have at least one page, so the same bound holds for descriptors. Nothing
 * here allocates after construction.
 */
final class ProtectionQueue implements AutoCloseable {
    public static final int PENDING = 0;
    public static final int DONE = 1;
    public static final int FAILED = 2;

    /** Runs one batch's protection; returns the seal epoch (ENCRYPT) or 0. Throws to fail the batch. */
    public interface Executor {
        int execute(byte level, int tenant, int[] pages, int[] generations, int count, byte[] dirtyByPage);
    }

    private final int capacity;
    private final int mask;
    private final int[] pageRing;
    private final int[] generationRing;
    private long pageHead;
    private long pageTail;
    private final long[] batchStart;
    private final int[] batchCount;
    private final long[] batchStep;
    private final byte[] batchLevel;
    private final int[] batchTenant;
    private final int[] batchEpoch;
    private final int[] batchStatus;
    private final String[] batchError;
    private long batchHead;
    private long batchTail;

    private final Executor executor;
    private final byte[] dirtyByPage;
    private final int[] execPages;
    private final int[] execGenerations;
    private final Object monitor = new Object();
    private final Thread worker;
    private long workerCursor;
    private boolean closed;

    public ProtectionQueue(int capacity, boolean asynchronous, Executor executor, String workerName) {
        this.capacity = capacity;
        int size = Integer.highestOneBit(Math.max(1, capacity) * 2 - 1); // a power of two: ring indexes are masks, not divisions
        this.mask = size - 1;
        pageRing = new int[size];
        generationRing = new int[size];
        batchStart = new long[size];
        batchCount = new int[size];
        batchStep = new long[size];
        batchLevel = new byte[size];
        batchTenant = new int[size];
        batchEpoch = new int[size];
        batchStatus = new int[size];
        batchError = new String[size];
        this.executor = executor;
        dirtyByPage = new byte[capacity];
        execPages = new int[capacity];
        execGenerations = new int[capacity];
        if (asynchronous) {
            worker = Thread.ofPlatform().name(workerName).daemon().unstarted(this::workLoop);
            worker.start();
        } else {
            worker = null;
        }
    }

    /**
     * Queues one batch (caller holds the pool lock). Synchronous queues execute it before returning.
     *
     * @return the batch number
     */
    public long submit(int[] pages, int[] generations, int offset, int count, byte level, int tenant, long step) {
        if (count <= 0 || pageTail - pageHead + count > capacity) {
            throw new IllegalStateException("protection queue overflow: " + (pageTail - pageHead) + " + " + count + " > " + capacity);
        }
        long start = pageTail;
        toRing(pages, offset, count, pageRing, start);
        toRing(generations, offset, count, generationRing, start);
        for (int i = offset; i < offset + count; i++) {
            dirtyByPage[pages[i]] = 0;
        }
        long b;
        synchronized (monitor) {
            pageTail += count;
            b = batchTail;
            int d = (int) (b & mask);
            batchStart[d] = start;
            batchCount[d] = count;
            batchStep[d] = step;
            batchLevel[d] = level;
            batchTenant[d] = tenant;
            batchEpoch[d] = 0;
            batchStatus[d] = PENDING;
            batchError[d] = null;
            batchTail++;
            monitor.notifyAll();
        }
        if (worker == null) {
            // NOTE: the submitter's arrays when they start the batch, else the ring's copy: the executor reads from index 0
            if (offset == 0) {
                execute(b, level, tenant, pages, generations, count);
            } else {
                run(b);
            }
        }
        return b;
    }

    private void workLoop() {
        while (true) {
            long b;
            synchronized (monitor) {
                while (workerCursor >= batchTail && !closed) {
                    try {
                        monitor.wait();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        return;
                    }
                }
                if (closed) {
                    return;
                }
                b = workerCursor;
            }
            run(b);
            synchronized (monitor) {
                workerCursor++;
            }
        }
    }

    private void run(long b) {
        int d = (int) (b & mask);
        int count;
        long start;
        byte level;
        int tenant;
        synchronized (monitor) {
            count = batchCount[d];
            start = batchStart[d];
            level = batchLevel[d];
            tenant = batchTenant[d];
        }
        fromRing(pageRing, start, count, execPages);
        fromRing(generationRing, start, count, execGenerations);
        execute(b, level, tenant, execPages, execGenerations, count);
    }

    /** Executes batch {@code b}, whose pages and generations are {@code pages[0, count)} and {@code generations[0, count)}. */
    private void execute(long b, byte level, int tenant, int[] pages, int[] generations, int count) {
        int d = (int) (b & mask);
        int status;
        int epoch = 0;
        String error = null;
        try {
            epoch = executor.execute(level, tenant, pages, generations, count, dirtyByPage);
            status = DONE;
        } catch (Throwable t) {
            status = FAILED;
            error = t.getClass().getSimpleName() + ": " + t.getMessage();
        }
        synchronized (monitor) {
            batchEpoch[d] = epoch;
            batchError[d] = error;
            batchStatus[d] = status;
            monitor.notifyAll();
        }
    }

    public boolean isEmpty() {
        synchronized (monitor) {
            return batchHead == batchTail;
        }
    }

    public long head() {
        synchronized (monitor) {
            return batchHead;
        }
    }

    public long tail() {
        synchronized (monitor) {
            return batchTail;
        }
    }

    /** Waits until batch {@code b} finished; false if {@code timeoutNanos} passed first. */
    public boolean await(long b, long timeoutNanos) {
        int d = (int) (b & mask);
        long deadline = System.nanoTime() + timeoutNanos;
        synchronized (monitor) {
            while (batchStatus[d] == PENDING) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                try {
                    monitor.wait(Math.max(1, left / 1_000_000), 0);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return false;
                }
            }
            return true;
        }
    }

    /** Removes the head batch (after it was collected). */
    public void popHead() {
        synchronized (monitor) {
            int d = (int) (batchHead & mask);
            pageHead += batchCount[d];
            batchHead++;
        }
    }

    public long step(long b) {
        return batchStep[(int) (b & mask)];
    }

    public byte level(long b) {
        return batchLevel[(int) (b & mask)];
    }

    public int tenant(long b) {
        return batchTenant[(int) (b & mask)];
    }

    public int count(long b) {
        return batchCount[(int) (b & mask)];
    }

    public int page(long b, int i) {
        return pageRing[(int) ((batchStart[(int) (b & mask)] + i) & mask)];
    }

    /** The pages of batch {@code b}, in order, into {@code out[0, count(b))}. */
    public void copyPages(long b, int[] out) {
        int d = (int) (b & mask);
        fromRing(pageRing, batchStart[d], batchCount[d], out);
    }

    /** Copies {@code src[offset, offset + count)} into {@code ring} from ring position {@code start} on, wrapping at its end. */
    private void toRing(int[] src, int offset, int count, int[] ring, long start) {
        int first = (int) (start & mask);
        int upToEnd = Math.min(count, mask + 1 - first); // NOTE: at most two pieces, up to the end and from the start
        System.arraycopy(src, offset, ring, first, upToEnd);
        System.arraycopy(src, offset + upToEnd, ring, 0, count - upToEnd);
    }

    /** Copies {@code count} entries of {@code ring} from ring position {@code start} on into {@code out[0, count)}. */
    private void fromRing(int[] ring, long start, int count, int[] out) {
        int first = (int) (start & mask);
        int upToEnd = Math.min(count, mask + 1 - first);
        System.arraycopy(ring, first, out, 0, upToEnd);
        System.arraycopy(ring, 0, out, upToEnd, count - upToEnd);
    }

    public int generation(long b, int i) {
        return generationRing[(int) ((batchStart[(int) (b & mask)] + i) & mask)];
    }

    public int status(long b) {
        synchronized (monitor) {
            return batchStatus[(int) (b & mask)];
        }
    }

    public int epoch(long b) {
        synchronized (monitor) {
            return batchEpoch[(int) (b & mask)];
        }
    }

    public String error(long b) {
        synchronized (monitor) {
            return batchError[(int) (b & mask)];
        }
    }

    /** True if the executor found a non-zero byte in this page during its last verify. */
    public boolean dirty(int page) {
        return dirtyByPage[page] != 0;
    }

    public long digest(long h) {
        synchronized (monitor) {
            for (long b = batchHead; b < batchTail; b++) {
                int d = (int) (b & mask);
                h = Digests.mix(h, batchStep[d]);
                h = Digests.mix(h, batchLevel[d]);
                h = Digests.mix(h, batchTenant[d]);
                for (int i = 0; i < batchCount[d]; i++) {
                    h = Digests.mix(h, pageRing[(int) ((batchStart[d] + i) & mask)]);
                }
            }
            return h;
        }
    }

    @Override
    public void close() {
        synchronized (monitor) {
            closed = true;
            monitor.notifyAll();
        }
        if (worker != null) {
            try {
                worker.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
