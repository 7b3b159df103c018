package dev.kvshield.testing;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Recognisable byte content for isolation tests: every byte encodes tenant, request, page and
 * position, never zero, so a leak can be attributed and a scrub can be told from a write.
 */
public final class Patterns {
    private Patterns() {}

    public static byte byteAt(int tenant, long request, int page, int buffer, long offset) {
        long h = tenant * 0x9E3779B97F4A7C15L + request * 0xC2B2AE3D27D4EB4FL + page * 0x165667B19E3779F9L
                + buffer * 0x27D4EB2F165667C5L + offset * 0x94D049BB133111EBL;
        h ^= h >>> 29;
        byte b = (byte) (h ^ (h >>> 17));
        return b == 0 ? (byte) 0x5A : b;
    }

    public static MemorySegment fill(Arena arena, long bytes, int tenant, long request, int page, int buffer) {
        MemorySegment s = arena.allocate(bytes);
        for (long i = 0; i < bytes; i++) {
            s.set(ValueLayout.JAVA_BYTE, i, byteAt(tenant, request, page, buffer, i));
        }
        return s;
    }

    /** True if {@code s} holds exactly the pattern of (tenant, request, page, buffer). */
    public static boolean matches(MemorySegment s, int tenant, long request, int page, int buffer) {
        for (long i = 0; i < s.byteSize(); i++) {
            if (s.get(ValueLayout.JAVA_BYTE, i) != byteAt(tenant, request, page, buffer, i)) {
                return false;
            }
        }
        return true;
    }

    public static boolean allZero(MemorySegment s) {
        for (long i = 0; i < s.byteSize(); i++) {
            if (s.get(ValueLayout.JAVA_BYTE, i) != 0) {
                return false;
            }
        }
        return true;
    }

    /** Counts bytes of {@code s} equal to the pattern at the same offset (a leak survives a partial scrub). */
    public static long countMatching(MemorySegment s, int tenant, long request, int page, int buffer) {
        long n = 0;
        for (long i = 0; i < s.byteSize(); i++) {
            if (s.get(ValueLayout.JAVA_BYTE, i) == byteAt(tenant, request, page, buffer, i)) {
                n++;
            }
        }
        return n;
    }
}
