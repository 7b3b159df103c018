/**
 * Micrometer metrics of a pool. {@link dev.kvshield.metrics.MetricNames} lists every name, type,
 * unit and tag in one place.
 */
package dev.kvshield.metrics;
