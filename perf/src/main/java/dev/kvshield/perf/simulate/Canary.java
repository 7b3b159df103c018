package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * KV content that says who wrote it: every 16-byte cell of a token slot encodes the writer's
 * tenant and request, the token position and a check word, so any cell read back can be attributed.
 *
 * <pre>
 * cell (two little-endian longs):
 *   word 0: (tenant + 1) &lt;&lt; 48 | request            (tenant &lt; 65535, request &lt; 2^48; never 0)
 *   word 1: position &lt;&lt; 32 | check32(word 0, position, buffer, cell index in the slot)
 * </pre>
 *
 * A cell is {@link #ZERO} (both words zero), {@link #CANARY} (the check holds: {@link #tenantOf},
 * {@link #requestOf}, {@link #positionOf} decode it) or {@link #NOISE} (anything else: ciphertext,
 * garbage). Random bytes pass the check with probability 2^-32.
 *
 * <p>Stateless and thread-safe; no method allocates.
 */
public final class Canary {
    public static final int CELL_BYTES = 16;
    public static final int ZERO = 0;
    public static final int CANARY = 1;
    public static final int NOISE = 2;

    private static final ValueLayout.OfLong WORD = ValueLayout.JAVA_LONG_UNALIGNED;
    private static final long REQUEST_MASK = (1L << 48) - 1;

    private Canary() {}

    /** Throws unless every buffer's bytes per token are a whole number of cells. */
    public static void checkGeometry(PoolGeometry geometry) {
        for (int b = 0; b < geometry.buffersPerLayer(); b++) {
            if (geometry.bytesPerToken(b) % CELL_BYTES != 0) {
                throw new InvalidGeometryException("canary content needs bytes per token that are a multiple of " + CELL_BYTES
                        + "; buffer kind " + geometry.kindOf(b) + " has " + geometry.bytesPerToken(b));
            }
        }
    }

    static long word0(int tenant, long request) {
        return ((long) (tenant + 1) << 48) | (request & REQUEST_MASK);
    }

    private static int check(long word0, int position, int buffer, int cell) {
        long h = word0 * 0x9E3779B97F4A7C15L ^ (position * 0xC2B2AE3D27D4EB4FL) ^ (((long) buffer << 20 | cell) * 0x165667B19E3779F9L);
        h ^= h >>> 31;
        h *= 0x94D049BB133111EBL;
        return (int) (h ^ (h >>> 29));
    }

    /**
     * Writes the canary of {@code tokens} token slots, positions {@code firstPosition ..}, of one
     * buffer into {@code dst} from byte 0.
     */
    public static void fill(MemorySegment dst, int tenant, long request, int firstPosition, int tokens, int buffer,
            int bytesPerToken) {
        long w0 = word0(tenant, request);
        int cells = bytesPerToken / CELL_BYTES;
        long at = 0;
        for (int t = 0; t < tokens; t++) {
            int position = firstPosition + t;
            long hi = (long) position << 32;
            for (int c = 0; c < cells; c++) {
                dst.set(WORD, at, w0);
                dst.set(WORD, at + 8, hi | (check(w0, position, buffer, c) & 0xFFFF_FFFFL));
                at += CELL_BYTES;
            }
        }
    }

    /** Classifies the cell at {@code offset} of {@code src}, a token slot's cell {@code cell} of {@code buffer}. */
    public static int classify(MemorySegment src, long offset, int buffer, int cell) {
        long w0 = src.get(WORD, offset);
        long w1 = src.get(WORD, offset + 8);
        if (w0 == 0 && w1 == 0) {
            return ZERO;
        }
        if ((w0 >>> 48) == 0) {
            return NOISE;
        }
        int position = (int) (w1 >>> 32);
        return (int) w1 == check(w0, position, buffer, cell) ? CANARY : NOISE;
    }

    /** The first word of the cell at {@code offset}: a canary's is {@code (tenant + 1) << 48 | request}. */
    static long firstWord(MemorySegment src, long offset) {
        return src.get(WORD, offset);
    }

    /** The writer's tenant of a cell {@link #classify} called {@link #CANARY}. */
    public static int tenantOf(MemorySegment src, long offset) {
        return (int) (src.get(WORD, offset) >>> 48) - 1;
    }

    /** The writer's request of a cell {@link #classify} called {@link #CANARY}. */
    public static long requestOf(MemorySegment src, long offset) {
        return src.get(WORD, offset) & REQUEST_MASK;
    }

    /** The token position of a cell {@link #classify} called {@link #CANARY}. */
    public static int positionOf(MemorySegment src, long offset) {
        return (int) (src.get(WORD, offset + 8) >>> 32);
    }
}
