/**
 * A tenant-scoped prefix cache over the pool: prefix matching never crosses tenants (cross-tenant
 * prefix hits are a timing side channel) except through an operator's shared namespace, which
 * regulated tenants never use; under {@code ENCRYPT} an evicted prefix is sealed instead of freed
 * and reclaimed (decrypted) on its tenant's next hit.
 */
package dev.kvshield.prefix;
