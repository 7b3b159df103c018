package dev.kvshield.memory;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import java.util.Arrays;

/**
 * The check every backend runs on the regions it is given: each buffer's bytes belong to that
 * buffer alone. Two buffers whose regions overlap would make one page's bytes another page's (or
 * one buffer's another's), so a tenant could read, through its own lease and every guard passing,
 * bytes another tenant wrote.
 */
public final class BufferRegions {
    private BufferRegions() {}

    /**
     * Throws unless the regions {@code [starts[b], starts[b] + geometry.bufferBytes(b))} are pairwise
     * disjoint (addresses in one address space: host or one device's).
     *
     * @throws InvalidGeometryException naming the two buffers and their ranges
     */
    public static void checkDisjoint(PoolGeometry geometry, long[] starts) {
        Integer[] order = new Integer[starts.length];
        for (int b = 0; b < order.length; b++) {
            order[b] = b;
        }
        Arrays.sort(order, (x, y) -> Long.compareUnsigned(starts[x], starts[y]));
        for (int i = 1; i < order.length; i++) {
            int prev = order[i - 1];
            int next = order[i];
            long prevEnd = starts[prev] + geometry.bufferBytes(prev);
            if (Long.compareUnsigned(starts[next], prevEnd) < 0) {
                throw new InvalidGeometryException(geometry.describeBuffer(next) + " at 0x" + Long.toHexString(starts[next])
                        + " overlaps " + geometry.describeBuffer(prev) + " [0x" + Long.toHexString(starts[prev]) + ", 0x"
                        + Long.toHexString(prevEnd) + "): each byte of KV must belong to one buffer");
            }
        }
    }
}
