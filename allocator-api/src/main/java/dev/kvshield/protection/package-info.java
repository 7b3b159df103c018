/**
 * What happens to a page between owners: the {@link dev.kvshield.protection.ProtectionLevel}s and
 * the {@link dev.kvshield.protection.PageSealer} SPI through which {@code tenant-keys} (or a GPU
 * backend) supplies per-tenant encryption.
 */
package dev.kvshield.protection;
