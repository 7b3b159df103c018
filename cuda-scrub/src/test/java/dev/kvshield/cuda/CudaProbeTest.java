package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.Arena;
import java.lang.foreign.SymbolLookup;
import org.junit.jupiter.api.Test;

/** No-GPU detection: clean, cached, with a reason; JCuda stays unloaded without a driver. */
class CudaProbeTest {
    private static boolean driverLibraryPresent() {
        try (Arena arena = Arena.ofConfined()) {
            SymbolLookup.libraryLookup("libcuda.so.1", arena);
            return true;
        } catch (IllegalArgumentException e) {
            return false;
        }
    }

    @Test
    void probeAnswersOnceWithAReason() {
        CudaProbe.Result first = CudaProbe.probe();
        assertSame(first, CudaProbe.probe());
        assertFalse(first.reason().isBlank());
        if (!driverLibraryPresent()) {
            assertFalse(first.available());
            assertTrue(first.reason().contains("libcuda.so.1"), first.reason());
        }
    }

    @Test
    void withoutADriverOpeningADeviceFailsNamingTheReason() {
        if (driverLibraryPresent()) {
            return; // a GPU machine: CudaGpuTest covers opening
        }
        CudaException e = assertThrows(CudaException.class, () -> CudaDevice.open(0));
        assertTrue(e.getMessage().contains("no usable GPU") && e.getMessage().contains("libcuda.so.1"), e.getMessage());
    }
}
