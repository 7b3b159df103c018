package dev.kvshield.perf.simulate;

import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;

/**
 * Finds the ENCRYPT key source and the raw cipher it is measured against, by name, so the lab runs
 * with or without the {@code tenant-keys} module on the class path: the report then lists ENCRYPT
 * as skipped, with the reason.
 *
 * <p>Implementation notes: {@code tenant-keys} sits beside {@code perf} in the module graph and is
 * built in parallel; looking its classes up by name keeps {@code perf} compiling without it. The
 * lab's key source is an ephemeral root key (fresh random bytes per JVM, never written anywhere).
 */
public final class Sealers {
    static final String FACTORY_CLASS = "dev.kvshield.keys.HostPageSealerFactory";
    static final String ROOT_KEY_SOURCE_CLASS = "dev.kvshield.keys.RootKeySource";
    static final String CHACHA20_CLASS = "dev.kvshield.keys.cipher.ChaCha20";

    private Sealers() {}

    /** The tenant-keys CPU sealer over an ephemeral root key, or why there is none. */
    public static Availability<PageSealerFactory> hostSealer() {
        try {
            Class<?> sourceType = Class.forName(ROOT_KEY_SOURCE_CLASS);
            Object source = sourceType.getMethod("ephemeral").invoke(null);
            Object factory = Class.forName(FACTORY_CLASS).getConstructor(sourceType).newInstance(source);
            return Availability.of((PageSealerFactory) factory);
        } catch (ClassNotFoundException e) {
            return Availability.unavailable("the tenant-keys module is not on the class path (" + e.getMessage() + " not found)");
        } catch (ReflectiveOperationException | ClassCastException e) {
            return Availability.unavailable("tenant-keys is on the class path but its sealer could not be built: " + e);
        }
    }

    /**
     * The raw ChaCha20 of tenant-keys as {@code (MemorySegment key, int[] nonceWords, long counter,
     * MemorySegment data) -> void}: the limit ENCRYPT's seal bandwidth is compared with.
     */
    public static Availability<MethodHandle> rawChaCha20() {
        try {
            MethodHandle xor = MethodHandles.publicLookup().findStatic(Class.forName(CHACHA20_CLASS), "xor",
                    MethodType.methodType(void.class, MemorySegment.class, int[].class, long.class, MemorySegment.class));
            return Availability.of(xor);
        } catch (ClassNotFoundException e) {
            return Availability.unavailable("the tenant-keys module is not on the class path (" + e.getMessage() + " not found)");
        } catch (ReflectiveOperationException e) {
            return Availability.unavailable("tenant-keys has no ChaCha20.xor(MemorySegment, int[], long, MemorySegment): " + e);
        }
    }
}
