/**
 * The trace-driven serving simulation: pools under test ({@code stock} and every kvshield level)
 * behind one {@link dev.kvshield.perf.simulate.ServingPool} interface, the scheduler loop that does
 * real memory work on them, canary content that attributes every byte, and the leak and residue
 * oracles.
 */
package dev.kvshield.perf.simulate;
