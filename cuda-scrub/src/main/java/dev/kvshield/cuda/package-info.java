/**
 * The GPU page backend: {@link dev.kvshield.cuda.CudaPageMemory} over own or engine-owned device
 * memory, fused kernels (scrub, ChaCha20 XOR, verify-zero) launched once per batch through JCuda's
 * driver API, {@link dev.kvshield.cuda.CudaProbe} (no-GPU detection that never loads JCuda's
 * natives without a driver) and {@link dev.kvshield.cuda.CudaDevice} (primary context, PTX module,
 * driver version floor).
 */
package dev.kvshield.cuda;
