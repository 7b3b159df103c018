package dev.kvshield.cuda;

import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDeviceGetAttribute;
import static jcuda.driver.JCudaDriver.cuDeviceGetCount;
import static jcuda.driver.JCudaDriver.cuDeviceGetName;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRelease;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuDriverGetVersion;
import static jcuda.driver.JCudaDriver.cuGetErrorName;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuModuleGetFunction;
import static jcuda.driver.JCudaDriver.cuModuleLoadData;
import static jcuda.driver.JCudaDriver.cuModuleUnload;

import dev.kvshield.cuda.kernel.KernelAbi;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.Properties;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdevice_attribute;
import jcuda.driver.CUfunction;
import jcuda.driver.CUmodule;
import jcuda.driver.CUresult;

/**
 * One GPU opened for kvshield: its primary context, the kernels module loaded from the committed
 * PTX, and the launch limits of the device. Opening checks the driver is new enough for the PTX
 * and fails naming both versions otherwise. No runtime compilation: the driver JIT-compiles the
 * committed PTX once when the module loads.
 *
 * <p>Every method that calls CUDA first makes the primary context current on the calling thread
 * ({@link #makeCurrent()}); callers that use JCuda directly must do the same. Thread-safe.
 */
public final class CudaDevice implements AutoCloseable {
    static final String PTX_RESOURCE = "/dev/kvshield/cuda/kernels.ptx";
    static final String STAMP_RESOURCE = "/dev/kvshield/cuda/kernels.ptx.stamp";
    /** Blocks per multiprocessor a grid-stride launch uses at most. */
    private static final int BLOCKS_PER_SM = 8;

    private final int ordinal;
    private final CUdevice device = new CUdevice();
    private final CUcontext context = new CUcontext();
    private final CUmodule module = new CUmodule();
    private final CUfunction scrub = new CUfunction();
    private final CUfunction verifyZero = new CUfunction();
    private final CUfunction chacha20Xor = new CUfunction();
    private final CUfunction readFold = new CUfunction();
    private final int maxBlocks;
    private final String name;
    private final int driverVersion;
    private volatile boolean closed;

    private CudaDevice(int ordinal) {
        this.ordinal = ordinal;
        CudaProbe.Result probe = CudaProbe.probe();
        if (!probe.available()) {
            throw new CudaException("no usable GPU: " + probe.reason());
        }
        int[] version = new int[1];
        check(cuDriverGetVersion(version), "cuDriverGetVersion");
        this.driverVersion = version[0];
        Properties stamp = loadStamp();
        int required = Integer.parseInt(stamp.getProperty("min.driver.version"));
        if (driverVersion < required) {
            throw new CudaException("the NVIDIA driver supports CUDA " + cudaVersion(driverVersion) + " (" + driverVersion
                    + ") but kernels.ptx (nvcc " + stamp.getProperty("nvcc.release") + ", " + stamp.getProperty("ptx.arch")
                    + ") needs CUDA " + cudaVersion(required) + " (" + required + ") or newer: install a newer driver");
        }
        check(cuDeviceGet(device, ordinal), "cuDeviceGet(" + ordinal + ")");
        check(cuDevicePrimaryCtxRetain(context, device), "cuDevicePrimaryCtxRetain(device " + ordinal + ")");
        try {
            makeCurrent();
            byte[] ptx = loadPtx();
            check(cuModuleLoadData(module, ptx), "cuModuleLoadData(kernels.ptx)");
            check(cuModuleGetFunction(scrub, module, KernelAbi.SCRUB), "cuModuleGetFunction(" + KernelAbi.SCRUB + ")");
            check(cuModuleGetFunction(verifyZero, module, KernelAbi.VERIFY_ZERO),
                    "cuModuleGetFunction(" + KernelAbi.VERIFY_ZERO + ")");
            check(cuModuleGetFunction(chacha20Xor, module, KernelAbi.CHACHA20_XOR),
                    "cuModuleGetFunction(" + KernelAbi.CHACHA20_XOR + ")");
            check(cuModuleGetFunction(readFold, module, KernelAbi.READ_FOLD),
                    "cuModuleGetFunction(" + KernelAbi.READ_FOLD + ")");
            int[] sms = new int[1];
            check(cuDeviceGetAttribute(sms, CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
                    "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
            this.maxBlocks = sms[0] * BLOCKS_PER_SM;
            byte[] nameBytes = new byte[256];
            check(cuDeviceGetName(nameBytes, nameBytes.length, device), "cuDeviceGetName");
            int end = 0;
            while (end < nameBytes.length && nameBytes[end] != 0) {
                end++;
            }
            this.name = new String(nameBytes, 0, end, java.nio.charset.StandardCharsets.US_ASCII);
        } catch (RuntimeException e) {
            cuDevicePrimaryCtxRelease(device);
            throw e;
        }
    }

    /**
     * Opens GPU {@code ordinal}.
     *
     * @throws CudaException if there is no usable GPU, the driver is older than the PTX needs
     *     (naming both versions), or a driver call fails
     */
    public static CudaDevice open(int ordinal) {
        return new CudaDevice(ordinal);
    }

    /** Makes this device's primary context current on the calling thread. */
    public void makeCurrent() {
        if (closed) {
            throw new IllegalStateException("CUDA device " + ordinal + " is closed");
        }
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent(primary context of device " + ordinal + ")");
    }

    /** Most blocks a grid-stride launch uses on this device. */
    public int maxBlocks() {
        return maxBlocks;
    }

    /** The driver's CUDA version as {@code major * 1000 + minor * 10}. */
    public int driverVersion() {
        return driverVersion;
    }

    public String name() {
        return name;
    }

    public int ordinal() {
        return ordinal;
    }

    CUfunction scrubFunction() {
        return scrub;
    }

    CUfunction verifyZeroFunction() {
        return verifyZero;
    }

    CUfunction chacha20XorFunction() {
        return chacha20Xor;
    }

    CUfunction readFoldFunction() {
        return readFold;
    }

    @Override
    public void close() {
        if (!closed) {
            makeCurrent();
            closed = true;
            cuModuleUnload(module);
            cuDevicePrimaryCtxRelease(device);
        }
    }

    @Override
    public String toString() {
        return "CudaDevice[" + ordinal + " " + name + ", driver " + cudaVersion(driverVersion) + "]";
    }

    /** Throws {@link CudaException} naming {@code call} and the driver's error unless {@code result} is success. */
    static void check(int result, String call) {
        if (result != CUresult.CUDA_SUCCESS) {
            throw failure(result, call);
        }
    }

    /**
     * The exception for a failed driver call, naming the call and the driver's error. Hot paths
     * build their message only after a failure: {@code if (r != 0) throw failure(r, "..." + n)}.
     */
    static CudaException failure(int result, String call) {
        String[] errorName = new String[1];
        cuGetErrorName(result, errorName);
        return new CudaException(call + " failed: " + (errorName[0] != null ? errorName[0] : CUresult.stringFor(result)) + " ("
                + result + ")");
    }

    /** Called by {@link CudaProbe} once libcuda.so.1 is known to exist. */
    static CudaProbe.Result initAndCount() {
        try {
            int init = cuInit(0);
            if (init != CUresult.CUDA_SUCCESS) {
                return new CudaProbe.Result(false, "cuInit failed: " + CUresult.stringFor(init));
            }
            int[] count = new int[1];
            int r = cuDeviceGetCount(count);
            if (r != CUresult.CUDA_SUCCESS || count[0] == 0) {
                return new CudaProbe.Result(false, "the driver reports no CUDA device (" + CUresult.stringFor(r) + ", count "
                        + count[0] + ")");
            }
            return new CudaProbe.Result(true, count[0] + " CUDA device(s)");
        } catch (UnsatisfiedLinkError | NoClassDefFoundError e) {
            return new CudaProbe.Result(false, "JCuda's driver library did not load: " + e.getMessage());
        }
    }

    static String cudaVersion(int version) {
        return (version / 1000) + "." + (version % 1000) / 10;
    }

    static Properties loadStamp() {
        Properties p = new Properties();
        try (InputStream in = CudaDevice.class.getResourceAsStream(STAMP_RESOURCE)) {
            if (in == null) {
                throw new CudaException("resource " + STAMP_RESOURCE + " is missing from the class path");
            }
            p.load(in);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return p;
    }

    private static byte[] loadPtx() {
        try (InputStream in = CudaDevice.class.getResourceAsStream(PTX_RESOURCE)) {
            if (in == null) {
                throw new CudaException("resource " + PTX_RESOURCE + " is missing from the class path");
            }
            byte[] text = in.readAllBytes();
            return Arrays.copyOf(text, text.length + 1); // the driver reads a NUL-terminated image
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
