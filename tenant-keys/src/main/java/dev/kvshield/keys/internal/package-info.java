/**
 * Internals of {@code tenant-keys} that nothing outside the module uses: key derivation over
 * Bouncy Castle, kept here so Bouncy Castle types never reach a public API.
 */
package dev.kvshield.keys.internal;
