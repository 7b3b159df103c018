/**
 * Micrometer metrics of a pool and their Prometheus endpoint. {@link dev.kvshield.metrics.MetricNames}
 * lists every name, type, unit and tag in one place; {@link dev.kvshield.metrics.PrometheusEndpoint}
 * serves a registry per tensor-parallel rank; {@link dev.kvshield.metrics.TenantMetrics} adds
 * per-tenant series for opted-in tenants only.
 */
package dev.kvshield.metrics;
