package dev.kvshield.cuda;

import dev.kvshield.protection.ProtectionException;

/**
 * A CUDA driver call failed, or the driver cannot run the kernels. The message names the call,
 * the driver's error name and the values involved. Pages a failed batch covered stay out of
 * circulation (it is a {@link ProtectionException}).
 */
public final class CudaException extends ProtectionException {
    public CudaException(String message) {
        super(message);
    }
}
