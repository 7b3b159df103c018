package dev.kvshield.memory.external;

import dev.kvshield.geometry.InvalidGeometryException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.HostPageMemory;
import java.lang.foreign.MemorySegment;

/**
 * Page memory an engine owns: one host region per buffer, given as a raw address and a length in
 * bytes (for example a contiguous CPU tensor of shape {@code (tokens, heads, headDim)}: page
 * {@code p} starts at {@code p * pageSizeTokens * bytesPerToken}).
 *
 * <p>The caller keeps the memory alive until {@link #close()}; closing does not free it. Creating
 * one is a restricted operation: the JVM needs {@code --enable-native-access}.
 */
public final class ExternalPageMemory extends HostPageMemory {
    private ExternalPageMemory(PoolGeometry geometry, MemorySegment[] buffers) {
        super(geometry, buffers);
    }

    /**
     * Wraps engine-owned regions, one per buffer in global buffer order.
     *
     * @throws InvalidGeometryException if the counts differ, an address is zero or negative, or a
     *     region is smaller than the geometry needs (the message names both sizes)
     */
    public static ExternalPageMemory wrap(PoolGeometry geometry, long[] addresses, long[] byteSizes) {
        if (addresses.length != geometry.bufferCount() || byteSizes.length != geometry.bufferCount()) {
            throw new InvalidGeometryException("geometry has " + geometry.bufferCount() + " buffers but " + addresses.length
                    + " addresses and " + byteSizes.length + " sizes were given");
        }
        MemorySegment[] buffers = new MemorySegment[addresses.length];
        for (int b = 0; b < addresses.length; b++) {
            if (addresses[b] <= 0 || byteSizes[b] <= 0) {
                throw new InvalidGeometryException("buffer " + b + " has address 0x" + Long.toHexString(addresses[b]) + " and "
                        + byteSizes[b] + " bytes; both must be positive");
            }
            buffers[b] = MemorySegment.ofAddress(addresses[b]).reinterpret(byteSizes[b]);
        }
        return new ExternalPageMemory(geometry, buffers);
    }

    /** Wraps segments the caller already has (e.g. from its own arena); they are not freed on close. */
    public static ExternalPageMemory wrap(PoolGeometry geometry, MemorySegment[] segments) {
        return new ExternalPageMemory(geometry, segments);
    }

    @Override
    public String describe() {
        return "external host memory (" + geometry().bufferCount() + " engine-owned buffers, " + geometry().pageCount()
                + " pages)";
    }

    @Override
    protected void release() {
        // Engine-owned: the engine frees it.
    }
}
