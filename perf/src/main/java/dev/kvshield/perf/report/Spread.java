package dev.kvshield.perf.report;

import java.util.Arrays;

/**
 * The median of repeated measurements with their range (the smallest and largest value): what the
 * report quotes instead of a single number. For a ratio over pairs, every pair's ratio lies within
 * {@code [min, max]}; {@link #halfRangeFraction()} states it as "median ± x".
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

    /**
     * Half the range relative to the median, {@code (max - min) / 2 / median}: the "± x" of the
     * report's spread (0.05 is ±5%).
     *
     * @throws IllegalStateException if the median is 0 (no relative spread)
     */
    public double halfRangeFraction() {
        if (median == 0) {
            throw new IllegalStateException("no relative spread around a median of 0 (min " + min + ", max " + max + ")");
        }
        return (max - min) / 2 / Math.abs(median);
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
