/**
 * How the bridge finds the {@link dev.kvshield.memory.PageMemory} backend for the engine's KV
 * buffers: providers by name, built-in for CPU memory, others (CUDA) found through
 * {@link java.util.ServiceLoader} so the bridge never depends on them.
 */
package dev.kvshield.bridge.memory;
