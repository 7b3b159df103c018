/**
 * How the bridge finds the {@link dev.kvshield.memory.PageMemory} backend for the engine's KV
 * buffers: providers by name, built-in for CPU memory, others found through
 * {@link java.util.ServiceLoader} ({@code cuda}, over cuda-scrub), each with the ENCRYPT sealer
 * that fits its memory.
 */
package dev.kvshield.bridge.memory;
