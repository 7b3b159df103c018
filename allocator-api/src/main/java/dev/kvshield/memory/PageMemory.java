package dev.kvshield.memory;

import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.MemorySegment;

/**
 * A backend that holds the bytes of every page of a pool: one region per buffer (layer x K/V or
 * latent, or any explicit list: scale, indexer, draft buffers, each of its own width), page
 * {@code p} of buffer {@code b} at byte offset {@code p * geometry.pageBytes(b)}.
 *
 * <p>Batch operations cover every buffer of every listed page in one call (one kernel launch on a
 * GPU). Each returns only when its work is complete and confirmed: a pool puts a page back into
 * circulation only after the call returned normally. A call that throws leaves the listed pages in
 * an unknown state; the pool keeps them out of circulation.
 *
 * <p>Every method checks page, buffer and slot bounds against the geometry and throws
 * {@link dev.kvshield.geometry.InvalidGeometryException} naming the values before touching memory.
 * Implementations are safe for concurrent calls that touch disjoint pages.
 */
public interface PageMemory extends AutoCloseable {
    PoolGeometry geometry();

    /** Zeroes every buffer of {@code pages[offset .. offset+count)}. */
    void scrub(int[] pages, int offset, int count);

    /**
     * Checks every byte of every buffer of {@code pages[offset .. offset+count)} is zero and writes
     * the pages that are not into {@code dirtyOut} from index 0, in the order they were listed.
     *
     * @return how many pages hold a non-zero byte ({@code 0} when all are clean)
     */
    int verifyZero(int[] pages, int offset, int count, int[] dirtyOut);

    /**
     * Zeroes every buffer of {@code pages[offset .. offset+count)}, then checks every byte is zero,
     * as {@link #scrub} then {@link #verifyZero}; a backend may fuse both into one pass (one launch).
     *
     * @return how many pages hold a non-zero byte after the scrub, listed in {@code dirtyOut}
     */
    default int scrubAndVerify(int[] pages, int offset, int count, int[] dirtyOut) {
        checkDirtyOut(dirtyOut, count);
        scrub(pages, offset, count);
        return verifyZero(pages, offset, count, dirtyOut);
    }

    /** Refuses a {@code dirtyOut} too short for {@code count} pages, before anything is scrubbed. */
    static void checkDirtyOut(int[] dirtyOut, int count) {
        if (dirtyOut.length < count) {
            throw new IllegalArgumentException("dirtyOut holds " + dirtyOut.length + " entries; " + count + " may be needed");
        }
    }

    /**
     * Writes {@code src} into token slots starting at {@code slot} of one page of one buffer; its
     * size must be a whole number of tokens of that buffer that fits in the page.
     */
    void write(int page, int buffer, int slot, MemorySegment src);

    /** Reads token slots starting at {@code slot} of one page of one buffer into {@code dst}. */
    void read(int page, int buffer, int slot, MemorySegment dst);

    /** True if {@link #hostRegion} can give direct access to page bytes (CPU backends). */
    default boolean isHostAccessible() {
        return false;
    }

    /**
     * The bytes of page {@code page} in buffer {@code buffer}, for host-side sealers. Only for
     * {@link #isHostAccessible() host-accessible} backends.
     */
    default MemorySegment hostRegion(int page, int buffer) {
        throw new UnsupportedOperationException(describe() + " has no host-accessible page regions");
    }

    /** One line naming the backend and its memory, for diagnostics and reports. */
    String describe();

    @Override
    void close();
}
