package dev.kvshield.perf.report;

import java.lang.management.CompilationMXBean;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;

/**
 * The JVM's own work so far, for telling measurement noise from cost: milliseconds the JIT
 * compilers spent (summed over compiler threads; -1 when the JVM does not monitor it) and garbage
 * collections with their accumulated time. Differences of two snapshots say what happened between.
 *
 * @param compileMillis accumulated JIT compilation time, or -1 if not monitored
 * @param gcCount collections so far, all collectors
 * @param gcMillis accumulated collection time, all collectors
 */
public record JvmActivity(long compileMillis, long gcCount, long gcMillis) {
    public static JvmActivity now() {
        CompilationMXBean jit = ManagementFactory.getCompilationMXBean();
        long compile = jit != null && jit.isCompilationTimeMonitoringSupported() ? jit.getTotalCompilationTime() : -1;
        long count = 0;
        long millis = 0;
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            count += Math.max(0, gc.getCollectionCount());
            millis += Math.max(0, gc.getCollectionTime());
        }
        return new JvmActivity(compile, count, millis);
    }

    /** What happened since {@code earlier} (compilation -1 if either is unmonitored). */
    public JvmActivity since(JvmActivity earlier) {
        long compile = compileMillis < 0 || earlier.compileMillis < 0 ? -1 : compileMillis - earlier.compileMillis;
        return new JvmActivity(compile, gcCount - earlier.gcCount, gcMillis - earlier.gcMillis);
    }

    /** The 1-minute system load average, or -1 where the OS does not give one. */
    public static double loadAverage() {
        return ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage();
    }
}
