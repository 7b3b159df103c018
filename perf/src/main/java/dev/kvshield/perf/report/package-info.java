/**
 * The protection-level report: interleaved timed rounds of every level against {@code stock},
 * separate oracle rounds, the same run's bandwidth limits, and the outputs ({@code report.json},
 * {@code report.md}, a self-contained {@code report.html} and PNG charts).
 */
package dev.kvshield.perf.report;
