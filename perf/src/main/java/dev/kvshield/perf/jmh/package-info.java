/**
 * JMH benchmarks. Run them with {@code ./kvshield bench [JMH args]}; performance claims are
 * ratios between benchmarks of the same run.
 */
package dev.kvshield.perf.jmh;
