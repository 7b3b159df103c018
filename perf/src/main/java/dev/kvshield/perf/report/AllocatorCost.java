package dev.kvshield.perf.report;

import dev.kvshield.perf.simulate.SimulationResult;
import java.util.List;

/**
 * What the allocator costs per scheduler step, in absolute terms: per timed run, the 50th and 99th
 * percentile (nearest rank) and the mean over its steps of the time spent inside the allocator's
 * calls (see {@link dev.kvshield.perf.simulate.ServingPool#allocatorNanos()}), summarised over runs
 * as a {@link Spread} in microseconds; and the share of that time spent protecting on release
 * (scrub, seal, verify, as the pool times them; ENCRYPT's zeroing of sealed pages at hand-out and
 * unsealing at reclaim are allocator time outside it), the median over runs of protection time ÷
 * allocator time.
 *
 * <p>{@link #shareOfModelStep} puts the medians against a model step the user names: a team reads
 * "the allocator adds x% to a decode step of y ms" for its own model and hardware.
 */
public record AllocatorCost(Spread p50Micros, Spread p99Micros, Spread meanMicros, double protectionShare) {
    /** How host-memory runs are timed. */
    public static final String HOST_TIMING = "host clock (System.nanoTime) around each allocator call on the simulation thread;"
            + " protection runs inside release, so its time is in the figure";
    /** How device-memory runs are timed. */
    public static final String DEVICE_TIMING = "host clock (System.nanoTime) around each allocator call; the device backend's"
            + " scrub, verify and seal calls return only after the device confirmed the kernel complete (cuEventSynchronize),"
            + " so device time is in the figure together with launch and synchronisation overhead (cuda-scrub exposes no"
            + " per-kernel CUDA event times)";

    /** What timed the allocator's calls on {@code memory}: {@link #HOST_TIMING} or {@link #DEVICE_TIMING}. */
    public static String timingSource(dev.kvshield.memory.PageMemory memory) {
        return memory.isHostAccessible() ? HOST_TIMING : DEVICE_TIMING;
    }

    /** The cost over {@code runs} (at least one). */
    public static AllocatorCost of(List<SimulationResult> runs) {
        if (runs.isEmpty()) {
            throw new IllegalArgumentException("no runs to summarise");
        }
        int n = runs.size();
        double[] p50 = new double[n];
        double[] p99 = new double[n];
        double[] mean = new double[n];
        double[] protection = new double[n];
        for (int i = 0; i < n; i++) {
            long[] allocator = runs.get(i).allocatorStepNanos();
            p50[i] = Spread.quantile(allocator, 0.50) / 1e3;
            p99[i] = Spread.quantile(allocator, 0.99) / 1e3;
            long total = sum(allocator);
            mean[i] = allocator.length == 0 ? 0 : total / 1e3 / allocator.length;
            protection[i] = total == 0 ? 0 : (double) sum(runs.get(i).protectionStepNanos()) / total;
        }
        return new AllocatorCost(Spread.of(p50), Spread.of(p99), Spread.of(mean), Spread.of(protection).median());
    }

    private static long sum(long[] values) {
        long s = 0;
        for (long v : values) {
            s += v;
        }
        return s;
    }

    /** Medians as fractions of a model step of {@code modelStepMillis}. */
    public Share shareOfModelStep(double modelStepMillis) {
        if (!(modelStepMillis > 0) || Double.isInfinite(modelStepMillis)) {
            throw new IllegalArgumentException("the model step must be a positive number of milliseconds: " + modelStepMillis);
        }
        double micros = modelStepMillis * 1e3;
        return new Share(p50Micros.median() / micros, p99Micros.median() / micros, meanMicros.median() / micros);
    }

    /** Allocator time as a fraction of one model step (0.01 is 1%). */
    public record Share(double p50, double p99, double mean) {}
}
