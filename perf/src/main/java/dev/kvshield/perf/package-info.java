/**
 * The lab platform teams run: JMH benchmarks ({@code jmh}), and later the serving simulation,
 * incident replays and the protection-level report.
 */
package dev.kvshield.perf;
