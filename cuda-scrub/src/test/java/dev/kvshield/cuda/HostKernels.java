package dev.kvshield.cuda;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.kvshield.testing.Requirements;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The host build of {@code src/main/cuda/kvshield_kernels.cu} (g++, built by Maven into
 * {@code target/native}), called through FFM: every kernel runs over a sequential CPU grid loop.
 */
final class HostKernels implements KernelLauncher {
    private static HostKernels instance; // guarded by HostKernels.class

    private final MethodHandle scrub;
    private final MethodHandle verifyZero;
    private final MethodHandle chacha20Xor;
    private final MethodHandle readFold;
    private final MethodHandle maxKeys;

    private HostKernels(Path library) {
        Linker linker = Linker.nativeLinker();
        SymbolLookup lookup = SymbolLookup.libraryLookup(library, Arena.global());
        FunctionDescriptor batch = FunctionDescriptor.ofVoid(JAVA_INT, JAVA_INT, ADDRESS, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT,
                JAVA_INT);
        scrub = linker.downcallHandle(lookup.findOrThrow("kvs_host_scrub"), batch);
        verifyZero = linker.downcallHandle(lookup.findOrThrow("kvs_host_verify_zero"), batch.appendArgumentLayouts(ADDRESS));
        chacha20Xor = linker.downcallHandle(lookup.findOrThrow("kvs_host_chacha20_xor"), batch.appendArgumentLayouts(ADDRESS));
        readFold = linker.downcallHandle(lookup.findOrThrow("kvs_host_read_fold"),
                FunctionDescriptor.ofVoid(JAVA_INT, JAVA_INT, ADDRESS, JAVA_LONG, ADDRESS));
        maxKeys = linker.downcallHandle(lookup.findOrThrow("kvs_host_max_keys"), FunctionDescriptor.of(JAVA_INT));
    }

    /** The loaded host build; skips (fails under kvshield.requireDeps) when g++ could not build it. */
    static synchronized HostKernels require() {
        if (instance == null) {
            String path = System.getProperty("kvshield.hostKernels", "");
            boolean present = !path.isEmpty() && Files.isRegularFile(Path.of(path));
            Requirements.assumeSoftware(present,
                    "g++ (the host build of the CUDA kernels, " + (path.isEmpty() ? "kvshield.hostKernels unset" : path)
                            + ", was not built)");
            instance = new HostKernels(Path.of(path));
        }
        return instance;
    }

    @Override
    public void scrub(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
            MemorySegment entries, int count, int unitsPerRegion) {
        invoke(scrub, blocks, threads, bases, pageBytes, bufferCount, entries, count, unitsPerRegion);
    }

    @Override
    public void verifyZero(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
            MemorySegment entries, int count, int unitsPerRegion, MemorySegment dirty) {
        invoke(verifyZero, blocks, threads, bases, pageBytes, bufferCount, entries, count, unitsPerRegion, dirty);
    }

    @Override
    public void chacha20Xor(int blocks, int threads, MemorySegment bases, MemorySegment pageBytes, int bufferCount,
            MemorySegment entries, int count, int unitsPerRegion, MemorySegment keys) {
        invoke(chacha20Xor, blocks, threads, bases, pageBytes, bufferCount, entries, count, unitsPerRegion, keys);
    }

    void readFold(int blocks, int threads, MemorySegment src, long units, MemorySegment out) {
        invoke(readFold, blocks, threads, src, units, out);
    }

    int maxKeys() {
        try {
            return (int) maxKeys.invokeExact();
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    private static void invoke(MethodHandle handle, Object... args) {
        try {
            handle.invokeWithArguments(args);
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }
}
