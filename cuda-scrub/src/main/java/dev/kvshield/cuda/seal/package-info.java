/**
 * The GPU page sealer ({@link dev.kvshield.cuda.seal.CudaPageSealer}) and its factory: tenant-keys'
 * keys and seal ledger driving the fused chacha20-xor kernel, one launch per seal or unseal batch.
 */
package dev.kvshield.cuda.seal;
