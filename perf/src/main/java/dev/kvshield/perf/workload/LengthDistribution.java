package dev.kvshield.perf.workload;

import java.util.Locale;
import java.util.SplittableRandom;

/**
 * A distribution of token counts, written as text: {@code fixed:N}, {@code uniform:MIN:MAX}
 * (inclusive) or {@code lognormal:MEDIAN:SIGMA} (the median in tokens and the sigma of the
 * underlying normal). Every draw is at least 1 token.
 */
public record LengthDistribution(Kind kind, double a, double b) {
    /** The distribution families. */
    public enum Kind {
        FIXED, UNIFORM, LOGNORMAL
    }

    public LengthDistribution {
        boolean ok = switch (kind) {
            case FIXED -> a >= 1;
            case UNIFORM -> a >= 1 && b >= a;
            case LOGNORMAL -> a >= 1 && b >= 0 && b <= 4;
        };
        if (!ok) {
            throw new IllegalArgumentException("invalid " + kind.name().toLowerCase(Locale.ROOT) + " distribution: a=" + a + " b=" + b
                    + " (fixed:N with N>=1, uniform:MIN:MAX with 1<=MIN<=MAX, lognormal:MEDIAN:SIGMA with MEDIAN>=1, 0<=SIGMA<=4)");
        }
    }

    /** Parses {@code fixed:N}, {@code uniform:MIN:MAX} or {@code lognormal:MEDIAN:SIGMA}. */
    public static LengthDistribution parse(String text) {
        String[] parts = text == null ? new String[0] : text.trim().split(":");
        try {
            if (parts.length == 2 && parts[0].equalsIgnoreCase("fixed")) {
                return new LengthDistribution(Kind.FIXED, Double.parseDouble(parts[1]), 0);
            }
            if (parts.length == 3 && parts[0].equalsIgnoreCase("uniform")) {
                return new LengthDistribution(Kind.UNIFORM, Double.parseDouble(parts[1]), Double.parseDouble(parts[2]));
            }
            if (parts.length == 3 && parts[0].equalsIgnoreCase("lognormal")) {
                return new LengthDistribution(Kind.LOGNORMAL, Double.parseDouble(parts[1]), Double.parseDouble(parts[2]));
            }
        } catch (NumberFormatException e) {
            // fall through to the error that lists the accepted forms
        }
        throw new IllegalArgumentException("cannot parse length distribution '" + text
                + "'; allowed: fixed:N, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA");
    }

    /** Draws a length in {@code [1, max]}. */
    public int draw(SplittableRandom random, int max) {
        double v = switch (kind) {
            case FIXED -> a;
            case UNIFORM -> a + random.nextInt((int) (b - a) + 1);
            case LOGNORMAL -> a * Math.exp(b * gaussian(random));
        };
        return (int) Math.max(1, Math.min(max, Math.round(v)));
    }

    private static double gaussian(SplittableRandom random) {
        // Box-Muller; nextDouble is in [0, 1), so 1 - u is in (0, 1] and the log is finite.
        double u = 1.0 - random.nextDouble();
        double v = random.nextDouble();
        return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
    }

    @Override
    public String toString() {
        return switch (kind) {
            case FIXED -> "fixed:" + (long) a;
            case UNIFORM -> "uniform:" + (long) a + ":" + (long) b;
            case LOGNORMAL -> "lognormal:" + (long) a + ":" + b;
        };
    }
}
