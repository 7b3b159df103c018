/**
 * The secure page pool: {@link dev.kvshield.pool.KvPagePool}, configured once through
 * {@link dev.kvshield.pool.PoolConfig}.
 */
package dev.kvshield.pool;
