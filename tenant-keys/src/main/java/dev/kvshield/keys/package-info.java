/**
 * Per-tenant page keys and the CPU sealer behind {@code ProtectionLevel.ENCRYPT}.
 *
 * <ul>
 *   <li>{@link dev.kvshield.keys.RootKeySource}: where a root key comes from (key file, inherited
 *       descriptor, ephemeral development key); {@link dev.kvshield.keys.RootKey} holds it off-heap.
 *   <li>{@link dev.kvshield.keys.TenantKeyring}: data keys per (tenant, epoch) derived with HKDF,
 *       rotation, retirement, crypto-shredding, and the one dangerous export for GPU launches.
 *   <li>{@link dev.kvshield.keys.SealLedger}: the seal bookkeeping every sealer shares (a page is
 *       sealed at most once per generation).
 *   <li>{@link dev.kvshield.keys.HostPageSealer} and its
 *       {@link dev.kvshield.keys.HostPageSealerFactory}: the {@code PageSealer} for host memory.
 * </ul>
 *
 * <p>Key bytes never reach {@code toString}, logs, metrics, exceptions or audit records; only key
 * ids and epochs do. Bouncy Castle types never appear in this module's public API.
 */
package dev.kvshield.keys;
