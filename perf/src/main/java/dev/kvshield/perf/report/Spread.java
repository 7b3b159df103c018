package dev.kvshield.perf.report;

import java.util.Arrays;

/**
 * The median of repeated measurements with their range: what the report quotes instead of a single
 * number, because these machines vary by about 20% from run to run.
 */
public record Spread(double median, double min, double max) {
    public static Spread of(double[] values) {
        if (values.length == 0) {
            throw new IllegalArgumentException("no values to summarise");
        }
        double[] v = values.clone();
        Arrays.sort(v);
        int n = v.length;
        double median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        return new Spread(median, v[0], v[n - 1]);
    }

    /**
     * True if {@code reference} lies within the range of these measurements: a ratio whose range
     * includes 1.0 is "within noise", not a cost.
     */
    public boolean covers(double reference) {
        return min <= reference && reference <= max;
    }

    /** The {@code q}-quantile (0..1) of {@code values}, nearest rank. */
    public static double quantile(long[] values, double q) {
        if (values.length == 0) {
            return 0;
        }
        long[] v = values.clone();
        Arrays.sort(v);
        int rank = (int) Math.ceil(q * v.length) - 1;
        return v[Math.max(0, Math.min(v.length - 1, rank))];
    }
}
