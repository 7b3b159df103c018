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
 * two runs of a pair share the machine.
 *
 * <p>Each timed round runs one pair per level: the level and a fresh {@code stock} (the yardstick)
 * on the same trace, over the same period; {@code stock} itself is paired with a second stock, which
 * shows the method's own noise. The two runs take turns of {@code turnSteps} scheduler steps each,
 * in the order A B B A A B ... so each side goes first in half of the turns: with one step per turn
 * (the report's default) they advance in lockstep and a slow-down of the machine lasting more than
 * a few milliseconds (another process, frequency changes, a JIT compilation of shared code) lands on
 * both; with an unbounded turn they run back to back. Between pairs the sides swap which runs first
 * and which of the two memory regions they use (the level order also rotates between rounds), so
 * neither side keeps a position or a region.
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
     * the yardstick takes the first turn and the first memory region (else the level does).
     */
    public record Slot(int round, int level, boolean stockFirst) {}

    private Pairing() {}

    /**
     * The timed pairs in run order: round by round, each round one pair per level, the level order
     * rotated by one each round; the yardstick goes first in slots whose running index is even.
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
                slots.add(new Slot(r, (i + r) % levels, slots.size() % 2 == 0));
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
     * Runs one timed pair: {@code level} against a fresh stock on the same trace, each side on its
     * own decode and prefill regions, in turns of {@code turnSteps} steps. The side that goes first
     * gets region 0.
     *
     * @param decode two decode regions of the trace's geometry
     * @param prefill two prefill regions of the same geometry
     * @return the stock run, then the level's
     */
    public static SimulationResult[] runPair(PoolFactory factory, Level level, Trace trace, SimulationOptions options,
            PageMemory[] decode, PageMemory[] prefill, boolean stockFirst, int turnSteps) {
        int stockRegion = stockFirst ? 0 : 1;
        try (ServingPool stock = factory.create(Level.STOCK, decode[stockRegion]);
                ServingPool stockPrefill = factory.create(Level.STOCK, prefill[stockRegion]);
                Handoff stockHandoff = Handoff.of(stockPrefill, stock);
                ServingPool pool = factory.create(level, decode[1 - stockRegion]);
                ServingPool levelPrefill = factory.create(level, prefill[1 - stockRegion]);
                Handoff handoff = Handoff.of(levelPrefill, pool)) {
            Simulator yardstick = new Simulator(stock, stockHandoff, trace, options);
            Simulator measured = new Simulator(pool, handoff, trace, options);
            if (stockFirst) {
                run(yardstick::step, measured::step, turnSteps);
            } else {
                run(measured::step, yardstick::step, turnSteps);
            }
            return new SimulationResult[] {yardstick.finish(), measured.finish()};
        }
    }
}
