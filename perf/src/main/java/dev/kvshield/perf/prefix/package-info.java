/**
 * What a prefix cache keeps under each protection level: a shared-prefix workload run through
 * {@link dev.kvshield.prefix.PrefixCache} under ZERO (an evicted prefix is gone) and ENCRYPT (an
 * evicted prefix is sealed and reclaimed on its tenant's next hit).
 */
package dev.kvshield.perf.prefix;
