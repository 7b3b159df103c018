package dev.kvshield.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.cuda.kernel.KernelAbi;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The committed PTX on the class path: built from the committed sources (the build's own check in
 * process-resources fails first; this test pins the same rule for IDE runs), for compute_80, and
 * exporting every kernel the backend looks up.
 */
class PtxResourceTest {
    private static String resource(String name) throws IOException {
        try (InputStream in = CudaDevice.class.getResourceAsStream(name)) {
            assertTrue(in != null, name + " missing");
            return new String(in.readAllBytes(), StandardCharsets.US_ASCII);
        }
    }

    @Test
    void stampHashesMatchTheKernelSources() throws IOException, NoSuchAlgorithmException {
        Properties stamp = CudaDevice.loadStamp();
        for (String source : new String[] {"kvshield_kernels.cu", "kvs_grid.h"}) {
            byte[] bytes = Files.readAllBytes(Path.of("src/main/cuda", source));
            String actual = HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(bytes));
            assertEquals(stamp.getProperty("source." + source + ".sha256"), actual,
                    source + " changed since kernels.ptx was built: run cuda-scrub/build-ptx.sh");
        }
    }

    @Test
    void ptxTargetsComputeEightyAndExportsEveryKernel() throws IOException {
        String ptx = resource(CudaDevice.PTX_RESOURCE);
        assertTrue(ptx.contains(".target sm_80"), "PTX must target compute_80");
        for (String kernel : new String[] {KernelAbi.SCRUB, KernelAbi.VERIFY_ZERO, KernelAbi.CHACHA20_XOR, KernelAbi.READ_FOLD}) {
            assertTrue(ptx.contains(".visible .entry " + kernel + "("), "PTX lacks kernel " + kernel);
        }
        assertTrue(!ptx.contains(".shared") && !ptx.contains("bar.sync") && !ptx.contains("shfl."),
                "kernels must not use shared memory, barriers or warp shuffles (the host build could not run them exactly)");
    }

    @Test
    void stampedDriverFloorMatchesThePtxIsaVersion() throws IOException {
        Matcher m = Pattern.compile("\\.version (\\d+)\\.(\\d+)").matcher(resource(CudaDevice.PTX_RESOURCE));
        assertTrue(m.find(), "PTX has no .version line");
        int isaMajor = Integer.parseInt(m.group(1));
        int floor = Integer.parseInt(CudaDevice.loadStamp().getProperty("min.driver.version"));
        // PTX ISA 9.x comes with CUDA 13.x, ISA 8.x with CUDA 12.x (NVIDIA's PTX ISA release notes).
        assertEquals(isaMajor + 4, floor / 1000, "stamp floor " + floor + " for PTX ISA " + m.group());
    }
}
