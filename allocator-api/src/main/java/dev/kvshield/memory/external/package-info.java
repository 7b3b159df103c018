/**
 * The external-memory host backend: buffers an engine owns (a CPU tensor's data pointer), handed
 * over as address and length. kvshield never frees them.
 */
package dev.kvshield.memory.external;
