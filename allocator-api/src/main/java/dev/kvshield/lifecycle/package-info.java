/**
 * The page life cycle, defined once: {@link dev.kvshield.lifecycle.PageLifecycle} is the state
 * table that both the pool and the tests read.
 */
package dev.kvshield.lifecycle;
