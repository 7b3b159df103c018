package dev.kvshield.cuda;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import jcuda.NativePointerObject;
import jcuda.driver.CUevent;
import jcuda.driver.CUstream;

/**
 * Wraps raw CUDA handles an engine hands over (a {@code cudaStream_t} / {@code CUstream}, a
 * {@code cudaEvent_t} / {@code CUevent}, e.g. {@code torch.cuda.Stream.cuda_stream} and
 * {@code torch.cuda.Event.cuda_event}) as JCuda objects.
 *
 * <p>Implementation notes: JCuda 12.6 has no public constructor from a raw handle
 * ({@code CUstream(long)} is package-private; {@code CUevent} has none), and runtime and driver
 * handles are the same pointers. JCuda keeps the handle in {@code NativePointerObject.nativePointer}
 * and reads it at each call, so we set that field through a private-lookup {@link VarHandle} (JCuda
 * sits in the unnamed module, which is open). Wrapping once at setup keeps the per-batch path free
 * of allocation and reflection.
 */
final class RawHandles {
    private static final VarHandle NATIVE_POINTER;

    static {
        try {
            NATIVE_POINTER = MethodHandles.privateLookupIn(NativePointerObject.class, MethodHandles.lookup())
                    .findVarHandle(NativePointerObject.class, "nativePointer", long.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError("this JCuda version keeps no NativePointerObject.nativePointer: " + e);
        }
    }

    private RawHandles() {}

    static CUstream stream(long handle) {
        CUstream stream = new CUstream();
        NATIVE_POINTER.set(stream, handle);
        return stream;
    }

    /** The raw address a JCuda pointer holds (for pointers JCuda allocated, whose byte offset is 0). */
    static long address(NativePointerObject pointer) {
        return (long) NATIVE_POINTER.get(pointer);
    }

    static CUevent event(long handle) {
        if (handle == 0) {
            throw new IllegalArgumentException("an event handle cannot be 0");
        }
        CUevent event = new CUevent();
        NATIVE_POINTER.set(event, handle);
        return event;
    }
}
