/**
 * The tenant-scoped prefix cache for SGLang's radix-cache backend:
 * {@link dev.kvshield.bridge.prefix.PrefixCacheBridge} maps SGLang's page ids and request ids onto
 * allocator-api's {@code PrefixCache} over a {@link dev.kvshield.bridge.SlotAllocator}'s pool.
 */
package dev.kvshield.bridge.prefix;
