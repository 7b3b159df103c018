/**
 * Allocation-free data structures of the pool (free stack, sealed LRU, reader and claim tables,
 * the protection queue). For this module only: nothing outside {@code allocator-api} may use them
 * (an architecture test keeps it so).
 */
package dev.kvshield.internal;
