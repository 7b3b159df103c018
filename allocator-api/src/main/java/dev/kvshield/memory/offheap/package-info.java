/** The off-heap host backend: one {@code Arena}-owned, 64-byte aligned segment per buffer. */
package dev.kvshield.memory.offheap;
