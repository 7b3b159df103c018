/**
 * Workloads for the serving simulation: request traces (arrival step, tenant, prompt and output
 * lengths, shared prefix, abort, handoff), drawn from seeded distributions or read from CSV.
 */
package dev.kvshield.perf.workload;
