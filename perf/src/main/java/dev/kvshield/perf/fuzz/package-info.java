/**
 * Differential trace fuzzing: seeded multi-tenant traces ({@link dev.kvshield.perf.fuzz.FuzzTrace},
 * {@link dev.kvshield.perf.fuzz.TraceGenerator}) replayed by a single-thread scheduler over a real
 * pool ({@link dev.kvshield.perf.fuzz.TraceRunner}), each request's read-back compared with the
 * same request run alone and with its own canary, the residue oracle at every hand-out, automatic
 * minimisation of findings ({@link dev.kvshield.perf.fuzz.Minimizer}) and time-bounded campaigns
 * ({@link dev.kvshield.perf.fuzz.Campaign}). Planted bugs plug in through
 * {@link dev.kvshield.perf.fuzz.Rig} from test code; nothing here switches a guard off.
 */
package dev.kvshield.perf.fuzz;
