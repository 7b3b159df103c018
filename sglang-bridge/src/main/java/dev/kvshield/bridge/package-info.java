/**
 * The engine facade: token-slot allocation for SGLang's KV allocators, driven from Python through
 * JPype with batch calls over shared direct buffers (one crossing per allocator call, never per
 * token). It maps SGLang's bare token-slot indices to pages, holds each page's current handle and
 * owner host-side, attributes pages to requests and tenants, and turns SGLang's frees (which carry no
 * generation) into checked pool releases.
 */
package dev.kvshield.bridge;
