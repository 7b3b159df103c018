package dev.kvshield.perf.report;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.perf.simulate.Handoff;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.PoolFactory;
import dev.kvshield.perf.simulate.ServingPool;
import dev.kvshield.perf.simulate.SimulationOptions;
import dev.kvshield.perf.simulate.SimulationResult;
import dev.kvshield.perf.simulate.Simulator;
import dev.kvshield.perf.workload.Trace;
import java.util.ArrayList;
import java.util.List;
import java.util.function.BooleanSupplier;

/**
 * How the report pairs each level with {@code stock}: the schedule of timed pairs and the way the
 * runs of a pair share the machine.
 *
 * <p>Each timed round runs one pair per level: the level against a fresh {@code stock} (the
 * yardstick) on the same trace, over the same period; {@code stock} itself is paired with a second
 * stock, which shows the method's own noise. A pair has two legs, and in each leg the two runs take
 * turns of {@code turnSteps} scheduler steps, in the order A B B A A B ... so each side goes first
 * in half of the turns: with one step per turn (the report's default) they advance in lockstep and a
 * slow-down of the machine lasting more than a few milliseconds (another process, frequency
 * changes, a JIT compilation of shared code) lands on both; with an unbounded turn they run back to
 * back. The two sides use two different memory regions, and the second leg swaps them (and who goes
 * first): where two regions of the same size serve at different speeds (their physical placement;
 * measured up to 15% apart on a loaded 2-core VM), the pair's ratio, taken over both legs' tokens
 * and time, cancels that factor. Pairs alternate which side starts on region 0, and the level order
 * rotates between rounds.
 *
 * <p>Stateless; {@link #schedule} is a pure function, {@link #run} calls the given steps and
 * {@link #runPair} runs a pair's simulations.
 */
public final class Pairing {
    /** Turns of one step each: the two runs of a pair advance in lockstep. */
    public static final int LOCKSTEP = 1;
    /** One turn each: the two runs of a pair run back to back. */
    public static final int BACK_TO_BACK = Integer.MAX_VALUE;

    /**
     * One timed pair: which level (an index into the caller's list), in which round, and whether
     * the yardstick starts the pair on memory region 0, taking the first turn (else the level does).
     */
    public record Slot(int round, int level, boolean stockFirst) {}

    private Pairing() {}

    /**
     * The timed pairs in run order: round by round, each round one pair per level, the level order
     * rotated by one each round; the yardstick starts on region 0 when round + level is even, so each
     * level alternates from round to round whatever the number of levels.
     *
     * @param levels levels paired with the yardstick
     * @throws IllegalArgumentException if {@code levels < 1} or {@code rounds < 1}
     */
    public static List<Slot> schedule(int levels, int rounds) {
        if (levels < 1 || rounds < 1) {
            throw new IllegalArgumentException("a schedule needs at least one level and one round: levels=" + levels + " rounds="
                    + rounds);
        }
        List<Slot> slots = new ArrayList<>(levels * rounds);
        for (int r = 0; r < rounds; r++) {
            for (int i = 0; i < levels; i++) {
                int level = (i + r) % levels;
                slots.add(new Slot(r, level, (r + level) % 2 == 0));
            }
        }
        return slots;
    }

    /**
     * Runs two step sources to the end in turns of {@code turnSteps} steps, ordered A B B A A B ...
     * (round {@code k} of turns starts with {@code first} when {@code k} is even); a source that
     * answers false is done and the other runs alone.
     *
     * @param first takes the first turn
     * @return how many turns were taken, for tests
     * @throws IllegalArgumentException if {@code turnSteps < 1}
     */
    public static long run(BooleanSupplier first, BooleanSupplier second, int turnSteps) {
        if (turnSteps < 1) {
            throw new IllegalArgumentException("turnSteps must be >= 1: " + turnSteps);
        }
        BooleanSupplier[] sources = {first, second};
        boolean[] live = {true, true};
        long turns = 0;
        for (int k = 0; live[0] || live[1]; k++) {
            for (int i = 0; i < 2; i++) {
                int s = k % 2 == 0 ? i : 1 - i;
                if (live[s]) {
                    live[s] = turn(sources[s], turnSteps);
                    turns++;
                }
            }
        }
        return turns;
    }

    /** Runs up to {@code steps} steps; false when the source is done. */
    private static boolean turn(BooleanSupplier source, int steps) {
        for (int i = 0; i < steps; i++) {
            if (!source.getAsBoolean()) {
                return false;
            }
        }
        return true;
    }

    /**
     * The runs of one pair, leg by leg: {@code stock[i]} and {@code level[i]} ran together in leg
     * {@code i}.
     */
    public record Pair(SimulationResult[] stock, SimulationResult[] level) {
        /**
         * The level's throughput ÷ stock's, each over both legs: tokens served ÷ serving time, summed
         * over the legs (a region's speed factor, on one side in one leg and on the other in the
         * next, cancels).
         */
        public double ratio() {
            return throughput(level) / throughput(stock);
        }

        private static double throughput(SimulationResult[] legs) {
            long tokens = 0;
            long nanos = 0;
            for (SimulationResult r : legs) {
                tokens += r.tokens();
                nanos += r.wallNanos();
            }
            return tokens / (nanos / 1e9);
        }
    }

    /**
     * Runs one timed pair: {@code level} against fresh stock pools on the same trace, in two legs;
     * in each, each side has its own decode and prefill regions and the two take turns of {@code
     * turnSteps} steps. In the first leg stock is on region 0 and goes first if {@code stockFirst},
     * else the level; the second leg swaps regions and who goes first.
     *
     * @param decode two decode regions of the trace's geometry
     * @param prefill two prefill regions of the same geometry
     */
    public static Pair runPair(PoolFactory factory, Level level, Trace trace, SimulationOptions options, PageMemory[] decode,
            PageMemory[] prefill, boolean stockFirst, int turnSteps) {
        SimulationResult[] stock = new SimulationResult[2];
        SimulationResult[] measured = new SimulationResult[2];
        for (int leg = 0; leg < 2; leg++) {
            boolean yardstickLeads = stockFirst == (leg == 0);
            int stockRegion = yardstickLeads ? 0 : 1;
            SimulationResult[] both = runLeg(factory, level, trace, options, decode, prefill, stockRegion, turnSteps);
            stock[leg] = both[0];
            measured[leg] = both[1];
        }
        return new Pair(stock, measured);
    }

    /** One leg: stock on {@code stockRegion}, the level on the other; the side on region 0 goes first. */
    private static SimulationResult[] runLeg(PoolFactory factory, Level level, Trace trace, SimulationOptions options,
            PageMemory[] decode, PageMemory[] prefill, int stockRegion, int turnSteps) {
        try (ServingPool stock = factory.create(Level.STOCK, decode[stockRegion]);
                ServingPool stockPrefill = factory.create(Level.STOCK, prefill[stockRegion]);
                Handoff stockHandoff = Handoff.of(stockPrefill, stock);
                ServingPool pool = factory.create(level, decode[1 - stockRegion]);
                ServingPool levelPrefill = factory.create(level, prefill[1 - stockRegion]);
                Handoff handoff = Handoff.of(levelPrefill, pool)) {
            Simulator yardstick = new Simulator(stock, stockHandoff, trace, options);
            Simulator measured = new Simulator(pool, handoff, trace, options);
            if (stockRegion == 0) {
                run(yardstick::step, measured::step, turnSteps);
            } else {
                run(measured::step, yardstick::step, turnSteps);
            }
            return new SimulationResult[] {yardstick.finish(), measured.finish()};
        }
    }
}
