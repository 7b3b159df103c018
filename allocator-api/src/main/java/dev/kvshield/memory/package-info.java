/**
 * Where page bytes live: the {@link dev.kvshield.memory.PageMemory} backend SPI (batch scrub,
 * verify-zero, slot reads and writes) and the host-memory backends in {@code offheap} (memory the
 * pool allocates) and {@code external} (memory an engine owns, handed over by address).
 */
package dev.kvshield.memory;
