package dev.kvshield.perf.report;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;

/** The pairing schedule and the turn order of a pair, on fixed inputs. */
class PairingTest {
    @Test
    void theScheduleRotatesLevelsPerRoundAndAlternatesWhoGoesFirst() {
        assertEquals(List.of(
                new Pairing.Slot(0, 0, true), new Pairing.Slot(0, 1, false), new Pairing.Slot(0, 2, true),
                new Pairing.Slot(1, 1, true), new Pairing.Slot(1, 2, false), new Pairing.Slot(1, 0, false)),
                Pairing.schedule(3, 2));
    }

    @Test
    void everyLevelAlternatesItsStartFromRoundToRound() {
        for (int levels : new int[] {4, 5}) {
            List<Pairing.Slot> slots = Pairing.schedule(levels, 4);
            assertEquals(4 * levels, slots.size());
            for (int level = 0; level < levels; level++) {
                int l = level;
                List<Boolean> starts = slots.stream().filter(s -> s.level() == l).map(Pairing.Slot::stockFirst).toList();
                boolean even = level % 2 == 0;
                assertEquals(List.of(even, !even, even, !even), starts, levels + " levels, level " + level + ": " + slots);
            }
        }
    }

    @Test
    void aScheduleNeedsALevelAndARound() {
        assertTrue(assertThrows(IllegalArgumentException.class, () -> Pairing.schedule(0, 3)).getMessage().contains("levels=0 rounds=3"));
        assertTrue(assertThrows(IllegalArgumentException.class, () -> Pairing.schedule(2, 0)).getMessage().contains("levels=2 rounds=0"));
    }

    /** A source of {@code steps} steps that logs its name per step run. */
    private static BooleanSupplier source(String name, int steps, List<String> log) {
        int[] left = {steps};
        return () -> {
            if (left[0] == 0) {
                return false;
            }
            left[0]--;
            log.add(name);
            return true;
        };
    }

    @Test
    void lockstepTakesTurnsInTheOrderABBA() {
        List<String> log = new ArrayList<>();
        Pairing.run(source("a", 4, log), source("b", 4, log), Pairing.LOCKSTEP);
        assertEquals(List.of("a", "b", "b", "a", "a", "b", "b", "a"), log);
    }

    @Test
    void theLongerSourceRunsOnAloneOnceTheOtherIsDone() {
        List<String> log = new ArrayList<>();
        Pairing.run(source("a", 2, log), source("b", 5, log), Pairing.LOCKSTEP);
        assertEquals(List.of("a", "b", "b", "a", "b", "b", "b"), log);
    }

    @Test
    void longerTurnsAndBackToBack() {
        List<String> turns = new ArrayList<>();
        Pairing.run(source("a", 5, turns), source("b", 3, turns), 2);
        assertEquals(List.of("a", "a", "b", "b", "b", "a", "a", "a"), turns);
        List<String> backToBack = new ArrayList<>();
        Pairing.run(source("a", 3, backToBack), source("b", 2, backToBack), Pairing.BACK_TO_BACK);
        assertEquals(List.of("a", "a", "a", "b", "b"), backToBack);
    }

    @Test
    void aPairsRatioPoolsTokensAndTimeOverBothLegs() {
        // Region 0 is 25% slower: stock 1.0 s there and 0.8 s on region 1; the level 10% slower than stock on each.
        Pairing.Pair pair = new Pairing.Pair(
                new dev.kvshield.perf.simulate.SimulationResult[] {AllocatorCostTest.timed(1000, 1_000_000_000L),
                        AllocatorCostTest.timed(1000, 800_000_000L)},
                new dev.kvshield.perf.simulate.SimulationResult[] {AllocatorCostTest.timed(1000, 880_000_000L),
                        AllocatorCostTest.timed(1000, 1_100_000_000L)});
        assertEquals(1.8 / 1.98, pair.ratio(), 1e-12, "the region factor cancels: 1 / 1.1");
        // Per leg the ratios would be 1.136 and 0.727: the pooled ratio is what the level costs.
    }

    @Test
    void aTurnNeedsAStep() {
        List<String> log = new ArrayList<>();
        assertTrue(assertThrows(IllegalArgumentException.class, () -> Pairing.run(source("a", 1, log), source("b", 1, log), 0))
                .getMessage().contains("turnSteps must be >= 1: 0"));
        assertTrue(log.isEmpty(), "nothing ran");
    }
}
