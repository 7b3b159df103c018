/**
 * The shape of a KV pool as data: layers, page size, buffers per layer and their bytes per token,
 * page count. Nothing else in kvshield hard-codes a model.
 */
package dev.kvshield.geometry;
