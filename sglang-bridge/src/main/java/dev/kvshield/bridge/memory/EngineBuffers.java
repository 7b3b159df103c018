package dev.kvshield.bridge.memory;

import java.util.Arrays;

/**
 * The engine's KV buffers and ordering handles as the Python side hands them over.
 *
 * @param addresses data pointer of each buffer in global buffer order (the geometry's buffer numbers)
 * @param byteSizes bytes of each buffer
 * @param deviceIndex the buffers' device ordinal, -1 for host memory
 * @param streamHandle the engine's stream ({@code torch.cuda.current_stream().cuda_stream}; 0 is the
 *     legacy default stream); ignored for host memory
 * @param eventHandles one event per further engine stream, re-recorded by the engine at each
 *     forward launch ({@code torch.cuda.Event.cuda_event}); empty for host memory
 */
public record EngineBuffers(long[] addresses, long[] byteSizes, int deviceIndex, long streamHandle, long[] eventHandles) {
    public EngineBuffers {
        if (addresses.length != byteSizes.length) {
            throw new IllegalArgumentException(addresses.length + " addresses but " + byteSizes.length + " sizes");
        }
        addresses = addresses.clone();
        byteSizes = byteSizes.clone();
        eventHandles = eventHandles.clone();
    }

    @Override
    public String toString() {
        return "EngineBuffers[" + addresses.length + " buffers, device " + deviceIndex + ", stream 0x"
                + Long.toHexString(streamHandle) + ", events " + Arrays.toString(eventHandles) + "]";
    }
}
