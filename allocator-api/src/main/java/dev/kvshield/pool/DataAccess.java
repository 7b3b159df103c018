package dev.kvshield.pool;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.lease.StaleLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.metrics.Rejection;
import java.lang.foreign.MemorySegment;

/**
 * Reads and writes of page bytes through leases: a write through a lease that may write records its
 * slots as written in the page's generation (a writer claim whose page was released writes into
 * quarantine and records nothing); a read through a lease that may read is served only from slots
 * written in the page's current generation. Guarded by the pool lock.
 */
final class DataAccess {
    private static final int WRITERS = LeaseTable.kinds(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION,
            LeaseKind.CLAIM_WRITER);
    private static final int READERS = LeaseTable.kinds(LeaseKind.OWNER, LeaseKind.NAMESPACE, LeaseKind.RESERVATION,
            LeaseKind.READER, LeaseKind.CLAIM_READER);

    private final PoolParts parts;
    /** The slots a batch's checks found, so recording it looks nothing up again (batches up to its length). */
    private final int[] batchSlots;

    DataAccess(PoolParts parts) {
        this.parts = parts;
        batchSlots = new int[parts.table().pageCount()];
    }

    /** {@link KvPagePool#write}, under the pool lock. */
    void write(int tenant, long holder, long lease, int buffer, int slot, MemorySegment src) {
        parts.guards().tenant(tenant);
        int s = parts.leases().checkHeld(lease, tenant, holder, WRITERS, "write");
        int tokens = parts.guards().tokensOf(buffer, src.byteSize());
        parts.geometry().checkSlots(slot, tokens);
        parts.memory().write(parts.leases().page(s), buffer, slot, src);
        markBufferWritten0(s, buffer, slot, slot + tokens);
    }

    /** {@link KvPagePool#writeAllBuffers}, under the pool lock. */
    void writeAllBuffers(int tenant, long holder, long lease, int slot, MemorySegment[] srcByBuffer) {
        parts.guards().tenant(tenant);
        int s = parts.leases().checkHeld(lease, tenant, holder, WRITERS, "write");
        int tokens = parts.guards().tokensOfEveryBuffer(srcByBuffer, false);
        parts.geometry().checkSlots(slot, tokens);
        int page = parts.leases().page(s);
        for (int b = 0; b < srcByBuffer.length; b++) {
            parts.memory().write(page, b, slot, srcByBuffer[b]);
        }
        markWritten0(s, slot, slot + tokens);
    }

    /** {@link KvPagePool#markWritten}, under the pool lock. */
    void markWritten(int tenant, long holder, long lease, int fromSlot, int toSlot) {
        parts.guards().tenant(tenant);
        int s = parts.leases().checkHeld(lease, tenant, holder, WRITERS, "markWritten");
        parts.geometry().checkSlots(fromSlot, toSlot - fromSlot);
        markWritten0(s, fromSlot, toSlot);
    }

    /** {@link KvPagePool#markWritten(int, long, long[], int, int, int, int)}, under the pool lock. */
    void markWritten(int tenant, long holder, long[] leases, int offset, int count, int fromSlot, int toSlot) {
        parts.guards().tenant(tenant);
        Guards.range("leases", leases.length, offset, count);
        parts.geometry().checkSlots(fromSlot, toSlot - fromSlot);
        boolean kept = count <= batchSlots.length;
        for (int i = offset; i < offset + count; i++) {
            int s = parts.leases().checkHeld(leases[i], tenant, holder, WRITERS, "markWritten");
            if (kept) {
                batchSlots[i - offset] = s;
            }
        }
        for (int i = offset; i < offset + count; i++) {
            markWritten0(kept ? batchSlots[i - offset] : parts.leases().slotOf(leases[i]), fromSlot, toSlot);
        }
    }

    /** {@link KvPagePool#read}, under the pool lock. */
    void read(int tenant, long holder, long lease, int buffer, int slot, MemorySegment dst) {
        parts.guards().tenant(tenant);
        int s = parts.leases().checkHeld(lease, tenant, holder, READERS, "read");
        int tokens = parts.guards().tokensOf(buffer, dst.byteSize());
        int page = checkReadable(s, tenant, holder, lease, buffer, slot, tokens);
        parts.memory().read(page, buffer, slot, dst);
        emitRead(page, tenant, holder, slot, tokens);
    }

    /** {@link KvPagePool#readAllBuffers}, under the pool lock. */
    void readAllBuffers(int tenant, long holder, long lease, int slot, MemorySegment[] dstByBuffer) {
        parts.guards().tenant(tenant);
        int s = parts.leases().checkHeld(lease, tenant, holder, READERS, "read");
        int tokens = parts.guards().tokensOfEveryBuffer(dstByBuffer, true);
        int page = checkReadable(s, tenant, holder, lease, -1, slot, tokens);
        for (int b = 0; b < dstByBuffer.length; b++) {
            parts.memory().read(page, b, slot, dstByBuffer[b]);
        }
        emitRead(page, tenant, holder, slot, tokens);
    }

    /** The {@code READ} event of slots {@code [slot, slot + tokens)} of {@code page}, after its bytes moved. */
    private void emitRead(int page, int tenant, long holder, int slot, int tokens) {
        parts.events().emit(PageEventType.READ, page, parts.table().generation(page), tenant, holder, ((long) slot << 32) | (slot + tokens));
    }

    /**
     * The page a read of slots {@code [slot, slot + tokens)} of {@code buffer} (-1: every buffer) through
     * lease slot {@code s} may read: the lease's generation is the page's, and every slot was written in
     * it, in that buffer.
     */
    private int checkReadable(int s, int tenant, long holder, long lease, int buffer, int slot, int tokens) {
        int page = parts.leases().page(s);
        parts.geometry().checkSlots(slot, tokens);
        if (!parts.table().is(page, PageState.OWNED) || parts.table().generation(page) != parts.leases().generation(s)) {
            throw parts.events().reject(Rejection.STALE, PageEventType.REJECT_STALE, page, parts.table().generation(page), tenant, holder, lease,
                    new StaleLeaseException(lease, "read: claim " + lease + " was taken on page " + page + " generation "
                            + parts.leases().generation(s) + "; the page is " + parts.table().state(page) + " at generation "
                            + parts.table().generation(page) + ": its content is no longer the claimed owner's"));
        }
        int unwritten = buffer < 0 ? parts.extent().firstUnwritten(page, slot, slot + tokens)
                : parts.extent().firstUnwritten(page, buffer, slot, slot + tokens);
        if (unwritten >= 0) {
            parts.metrics().readBeforeWrite();
            parts.events().emit(PageEventType.REJECT_READ_BEFORE_WRITE, page, parts.table().generation(page), tenant, holder, lease);
            throw new ReadBeforeWriteException("read before write: page=" + page + " generation=" + parts.table().generation(page)
                    + " slot=" + unwritten + " was not written in this generation (read of slots [" + slot + ", "
                    + (slot + tokens) + "))");
        }
        return page;
    }

    /** {@link KvPagePool#claimWrote}, under the pool lock. */
    boolean claimWrote(long claim, int fromSlot, int toSlot) {
        int s = parts.leases().slotOf(claim);
        if (s < 0 || !parts.leases().kindOf(s).isClaim()) {
            throw new IllegalArgumentException(parts.leases().ids().describe(claim) + " is not a live claim");
        }
        parts.geometry().checkSlots(fromSlot, toSlot - fromSlot);
        return parts.leases().claimWrote(s, fromSlot, toSlot);
    }

    /**
     * Records a single-buffer write of slots {@code [from, to)}: its {@code WRITE} event, the slots as
     * written for that buffer, and as written in full (the extent, a claim's coverage) for each run of
     * slots now written in every buffer. A write through a claim whose page moved on (into
     * quarantine) records only the claim's own evidence of what it wrote, as {@link #markWritten0}.
     */
    private void markBufferWritten0(int s, int buffer, int from, int to) {
        int page = parts.leases().page(s);
        int g = parts.leases().generation(s);
        if (to <= from || !parts.table().is(page, PageState.OWNED) || parts.table().generation(page) != g) {
            markWritten0(s, from, to);
            return;
        }
        int runFrom = -1;
        for (int slot = from; slot <= to; slot++) {
            if (slot < to && parts.extent().markBuffer(page, buffer, slot)) {
                runFrom = runFrom < 0 ? slot : runFrom;
            } else if (runFrom >= 0) {
                if (parts.leases().kindOf(s).isClaim()) {
                    parts.leases().markClaimWritten(s, runFrom, slot);
                }
                parts.extent().mark(page, runFrom, slot);
                runFrom = -1;
            }
        }
        parts.events().emit(PageEventType.WRITE, page, g, parts.leases().tenant(s), parts.leases().holder(s), ((long) from << 32) | to);
    }

    private void markWritten0(int s, int from, int to) {
        if (to <= from) {
            return;
        }
        int page = parts.leases().page(s);
        if (parts.leases().kindOf(s).isClaim()) {
            parts.leases().markClaimWritten(s, from, to);
        }
        if (parts.table().is(page, PageState.OWNED) && parts.table().generation(page) == parts.leases().generation(s)) {
            parts.extent().mark(page, from, to);
            parts.events().emit(PageEventType.WRITE, page, parts.leases().generation(s), parts.leases().tenant(s), parts.leases().holder(s), ((long) from << 32) | to);
        }
    }
}
