/**
 * The tenant-scoped, sealed prefix cache for SGLang's radix-cache backend {@code kvshield}:
 * {@link dev.kvshield.bridge.prefix.PrefixCacheBridge} moves a {@link dev.kvshield.bridge.SlotAllocator}'s
 * pages into and out of tenants' cache namespaces (take, duplicate release, readers for lock holders,
 * eviction into sealed references, reclaim) by page id, for the tree the Python backend keeps.
 */
package dev.kvshield.bridge.prefix;
