/**
 * Page handles: a {@code long} naming a page and the generation it was handed out in. Every
 * operation that touches a page checks the generation, so use after free, double free and late
 * writes fail as {@link dev.kvshield.handle.StaleHandleException}.
 */
package dev.kvshield.handle;
