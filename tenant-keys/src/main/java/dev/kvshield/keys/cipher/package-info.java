/**
 * The page cipher: {@link dev.kvshield.keys.cipher.ChaCha20} (RFC 8439, in place on a
 * {@link java.lang.foreign.MemorySegment}) and {@link dev.kvshield.keys.cipher.PageNonces}, the
 * layout of nonce and block counter per page region that every sealer (CPU and GPU) uses.
 */
package dev.kvshield.keys.cipher;
