package dev.kvshield.audit.internal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * Runs give back exactly the events added: the same multiset, every page's events in the order
 * they came, and every event that stands alone at its own position; lockstep batches fold into one
 * run per type. The oracle is checked against a planted coalescer that joins like events without
 * minding the pages of later runs: it must be caught reordering a page's events.
 */
class EventRunsTest {
    private static final int PAGES = 6;

    /** One event as added. */
    private record Event(byte type, boolean joinable, int page, int gen, int tenant, long owner, long detail, byte kind, long peer) {
        boolean alone() {
            return !joinable || page < 0 || page >= PAGES;
        }

        boolean sameKind(Event o) {
            return type == o.type && tenant == o.tenant && owner == o.owner && detail == o.detail && kind == o.kind && peer == o.peer;
        }
    }

    private static List<Event> randomEvents(SplittableRandom rng, int n) {
        List<Event> events = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            if (!events.isEmpty() && rng.nextInt(4) == 0) {
                events.add(events.getLast()); // a repeat, as a read per buffer of one page
                continue;
            }
            int page = rng.nextInt(12) == 0 ? (rng.nextBoolean() ? -1 : PAGES) : rng.nextInt(PAGES);
            events.add(new Event((byte) rng.nextInt(4), rng.nextInt(10) != 0, page, rng.nextInt(3), rng.nextInt(2), rng.nextInt(2),
                    rng.nextInt(2), (byte) (rng.nextInt(3) - 1), rng.nextInt(2)));
        }
        return events;
    }

    /** Adds {@code events} to fresh runs with {@code capacity}, draining when full; returns what the runs give back, expanded. */
    private static List<Event> throughRuns(List<Event> events, int capacity) {
        long[] clock = {0};
        EventRuns runs = new EventRuns(capacity, PAGES, () -> clock[0]++);
        List<Event> out = new ArrayList<>();
        for (Event e : events) {
            if (runs.add(e.type, e.joinable, e.page, e.gen, e.tenant, e.owner, e.detail, e.kind, e.peer, 7)) {
                drain(runs, out);
            }
        }
        drain(runs, out);
        return out;
    }

    private static void drain(EventRuns runs, List<Event> out) {
        for (int r = 0; r < runs.runs(); r++) {
            assertEquals(7, runs.step(r));
            for (int e = runs.first(r); e >= 0; e = runs.next(e)) {
                for (int t = 0; t < runs.times(e); t++) {
                    // Runs do not keep the joinable flag: events compare without it (see seen()).
                    out.add(new Event(runs.type(r), true, runs.page(e), runs.generation(e), runs.tenant(r), runs.owner(r), runs.detail(r),
                            runs.kind(r), runs.peer(r)));
                }
            }
        }
        runs.clear();
    }

    /** An event as a reader sees it: everything but the joinable flag. */
    private static Event seen(Event e) {
        return new Event(e.type, true, e.page, e.gen, e.tenant, e.owner, e.detail, e.kind, e.peer);
    }

    /** What is wrong with {@code out} as a regrouping of {@code in}, or null. */
    private static String violation(List<Event> in, List<Event> out) {
        if (in.size() != out.size()) {
            return in.size() + " events in, " + out.size() + " out";
        }
        Map<Integer, List<Event>> inByPage = new HashMap<>();
        Map<Integer, List<Event>> outByPage = new HashMap<>();
        for (Event e : in) {
            inByPage.computeIfAbsent(e.page, k -> new ArrayList<>()).add(seen(e));
        }
        for (Event e : out) {
            outByPage.computeIfAbsent(e.page, k -> new ArrayList<>()).add(seen(e));
        }
        if (!inByPage.equals(outByPage)) {
            return "a page's events differ or come in another order";
        }
        for (int i = 0; i < in.size(); i++) {
            if (in.get(i).alone() && !seen(in.get(i)).equals(seen(out.get(i)))) {
                return "the event standing alone at " + i + " moved";
            }
        }
        return null;
    }

    @Test
    void runsGiveBackEveryEventWithEachPagesOrderAndEveryLoneEventInPlace() {
        long seed = 0x5EED_0AD1L;
        SplittableRandom rng = new SplittableRandom(seed);
        for (int trial = 0; trial < 400; trial++) {
            List<Event> in = randomEvents(rng, 1 + rng.nextInt(120));
            int capacity = 1 + rng.nextInt(40);
            int t = trial;
            assertNull(violation(in, throughRuns(in, capacity)), () -> "seed " + seed + " trial " + t + " capacity " + capacity);
        }
    }

    @Test
    void theOracleCatchesACoalescerThatIgnoresLaterRuns() {
        long seed = 0x5EED_0AD1L;
        SplittableRandom rng = new SplittableRandom(seed);
        int caught = 0;
        for (int trial = 0; trial < 400; trial++) {
            List<Event> in = randomEvents(rng, 1 + rng.nextInt(120));
            if (violation(in, naive(in)) != null) {
                caught++;
            }
        }
        assertTrue(caught > 100, "the planted coalescer must be caught reordering: " + caught + " of 400");
    }

    /** Planted bug: joins the newest open run of the same kind whatever later runs hold (and keeps lone events apart). */
    private static List<Event> naive(List<Event> in) {
        List<List<Event>> runs = new ArrayList<>();
        int openFrom = 0;
        for (Event e : in) {
            List<Event> join = null;
            for (int r = runs.size() - 1; r >= openFrom && !e.alone(); r--) {
                if (runs.get(r).getFirst().sameKind(e) && !runs.get(r).getFirst().alone()) {
                    join = runs.get(r);
                    break;
                }
            }
            if (join == null) {
                if (e.alone()) {
                    openFrom = runs.size() + 1;
                }
                runs.add(new ArrayList<>(List.of(e)));
            } else {
                join.add(e);
            }
        }
        return runs.stream().flatMap(List::stream).toList();
    }

    @Test
    void aLockstepBatchFoldsIntoOneRunPerTypeAndRepeatsIntoCounts() {
        long[] clock = {100};
        EventRuns runs = new EventRuns(64, 16, () -> clock[0]++);
        for (int p = 0; p < 16; p++) {
            for (int buffer = 0; buffer < 4; buffer++) {
                runs.add((byte) 3, true, p, 2, 0, 9, 16, (byte) -1, 0, 1);
            }
        }
        for (int p = 0; p < 16; p++) {
            runs.add((byte) 12, true, p, 3, 0, -1, 4, (byte) -1, 0, 1);
            runs.add((byte) 16, true, p, 3, -1, -1, 0, (byte) -1, 0, 1);
        }
        assertEquals(3, runs.runs(), "reads, then protect-done and free in lockstep");
        int entries = 0;
        for (int e = runs.first(0); e >= 0; e = runs.next(e)) {
            assertEquals(4, runs.times(e), "one entry per page, read once per buffer");
            entries++;
        }
        assertEquals(16, entries);
        assertEquals(100, runs.monoNanos(0), "a run's time is its first event's");
        assertEquals(101, runs.monoNanos(1));
        // Page 0 again, after the free run that lists it: a new run, so page 0's order is kept.
        runs.add((byte) 12, true, 0, 3, 0, -1, 4, (byte) -1, 0, 1);
        assertEquals(4, runs.runs());
    }

    @Test
    void aLabelledRunStandsAloneAndItsLabelIsGoneAfterClear() {
        EventRuns runs = new EventRuns(8, 16, () -> 0);
        runs.add((byte) 3, true, 1, 0, 0, 9, 4, (byte) -1, 0, 1);
        runs.addLabelled((byte) -1, 0, 9, 0, "rid-9", 1);
        runs.add((byte) 3, true, 2, 0, 0, 9, 4, (byte) -1, 0, 1);
        assertEquals(3, runs.runs(), "the summary closes the read run before it");
        assertEquals(null, runs.label(0));
        assertEquals("rid-9", runs.label(1));
        assertEquals(-1, runs.page(runs.first(1)), "it names no page");
        runs.clear();
        runs.addLabelled((byte) -1, 0, 10, 0, null, 2);
        runs.add((byte) 3, true, 1, 0, 0, 9, 4, (byte) -1, 0, 2);
        assertEquals(null, runs.label(0), "run 0 of the next batch does not inherit the label");
        assertEquals(null, runs.label(1));
    }
}
