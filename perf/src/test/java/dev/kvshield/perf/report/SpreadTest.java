package dev.kvshield.perf.report;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** Median, range, relative spread and nearest-rank percentiles on fixed inputs. */
class SpreadTest {
    private static final double EXACT = 1e-12;

    @Test
    void theMedianOfPerPairRatiosWithItsRange() {
        Spread s = Spread.of(new double[] {0.97, 0.95, 1.02, 0.99, 1.00});
        assertEquals(new Spread(0.99, 0.95, 1.02), s);
        assertEquals(0.035 / 0.99, s.halfRangeFraction(), EXACT);
        assertTrue(s.covers(1.0), "a range containing 1 is within noise");
        assertFalse(Spread.of(new double[] {0.80, 0.82, 0.81}).covers(1.0));
    }

    @Test
    void anEvenCountTakesTheMeanOfTheMiddleTwo() {
        assertEquals(new Spread(0.5, 0.2, 0.9), Spread.of(new double[] {0.9, 0.2, 0.6, 0.4}));
    }

    @Test
    void theInputIsNotReordered() {
        double[] ratios = {3, 1, 2};
        Spread.of(ratios);
        assertEquals(3, ratios[0]);
    }

    @Test
    void nothingToSummariseOrNoRelativeSpreadThrow() {
        assertThrows(IllegalArgumentException.class, () -> Spread.of(new double[0]));
        assertTrue(assertThrows(IllegalStateException.class, () -> new Spread(0, -1, 1).halfRangeFraction()).getMessage()
                .contains("min -1.0, max 1.0"));
    }

    @Test
    void percentilesAreNearestRank() {
        long[] hundred = new long[100];
        for (int i = 0; i < 100; i++) {
            hundred[99 - i] = i + 1; // 100 .. 1, unsorted
        }
        assertEquals(50, Spread.quantile(hundred, 0.50));
        assertEquals(99, Spread.quantile(hundred, 0.99));
        long[] ten = {7, 1, 9, 3, 10, 2, 8, 4, 6, 5};
        assertEquals(5, Spread.quantile(ten, 0.50));
        assertEquals(10, Spread.quantile(ten, 0.99), "with 10 steps the 99th percentile is the slowest");
        assertEquals(0, Spread.quantile(new long[0], 0.5));
    }
}
