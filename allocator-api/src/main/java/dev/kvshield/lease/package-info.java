/**
 * Leases: every hold on a page is a pool-minted lease, a 64-bit id never reused in the pool's
 * lifetime ({@link dev.kvshield.lease.LeaseIds}), bound to page, generation, tenant, holder and
 * {@link dev.kvshield.lease.LeaseKind}. The pool counts the holds on each page itself
 * ({@link dev.kvshield.lease.LeaseTable}); a page is released, protected and reused only when no
 * content lease is left, and protected only when no claim is left. A lease presented twice, by
 * another holder, for another page or after its generation moved is refused with its own
 * {@link dev.kvshield.lease.LeaseException}, and the pool is unchanged.
 */
package dev.kvshield.lease;
