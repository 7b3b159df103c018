/**
 * kvshield: a KV-cache page allocator that makes cross-request and cross-tenant leaks through
 * reused KV memory impossible by construction.
 *
 * <p>Start at {@link dev.kvshield.pool.KvPagePool}. One package per concept of the page life
 * cycle: {@code geometry}, {@code handle}, {@code tenant}, {@code protection}, {@code lifecycle},
 * {@code claims}, {@code extent}, {@code quarantine}, {@code memory}, {@code admission},
 * {@code metrics}, {@code audit}; {@code internal} is for this module only.
 */
package dev.kvshield;
