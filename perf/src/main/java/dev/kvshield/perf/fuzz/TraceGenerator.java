package dev.kvshield.perf.fuzz;

import dev.kvshield.perf.fuzz.FuzzTrace.Action;
import dev.kvshield.perf.fuzz.FuzzTrace.Event;
import dev.kvshield.perf.fuzz.FuzzTrace.Kind;
import dev.kvshield.perf.fuzz.FuzzTrace.RequestSpec;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

/**
 * Seeded multi-tenant traces: a tiny pool (so pages are reused fast, last released first), a few
 * tenants, overlapping local and handoff requests with shared prefixes, cancellations at random
 * points (mid-transfer included), allocation retries, "done" signals delayed or lost, claim timers
 * that fire, lost transfer pages, prefix evictions, step boundaries and protection-worker turns,
 * all interleaved by one seeded merge of every actor's script. On top, the lease operations:
 * hostile batches ({@link Misuse}: every batch call, every kind of bad id, at every position),
 * unmatches (again, and before a match), claim churn, pools started a few ids before the lease
 * counter's end or a few generations before the last or with a handful of claim slots, backend faults after any number of pages of
 * a batch, and under a sealing level batch reclaims (with duplicate and foreign references) and
 * key operators racing them. The same seed gives the same trace.
 *
 * @param level the level of every trace, or {@code null} for a random one of {@code levels}
 * @param mode the quarantine mode, or {@code null} for a random one
 * @param levels the levels a random pick chooses from
 */
public record TraceGenerator(ProtectionLevel level, QuarantineMode mode, List<ProtectionLevel> levels) {
    public TraceGenerator {
        levels = List.copyOf(levels);
        if (level == null && levels.isEmpty()) {
            throw new IllegalArgumentException("no level to choose from");
        }
    }

    /** Random level of {@code levels} and random mode. */
    public static TraceGenerator any(List<ProtectionLevel> levels) {
        return new TraceGenerator(null, null, levels);
    }

    /** Every trace at {@code level} in {@code mode}. */
    public static TraceGenerator fixed(ProtectionLevel level, QuarantineMode mode) {
        return new TraceGenerator(level, mode, List.of());
    }

    public FuzzTrace generate(long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        ProtectionLevel lvl = level != null ? level : levels.get(rnd.nextInt(levels.size()));
        QuarantineMode qm = mode != null ? mode : rnd.nextInt(4) == 0 ? QuarantineMode.ASYNCHRONOUS : QuarantineMode.SYNCHRONOUS;
        int tenants = 1 + rnd.nextInt(3);
        int lag = rnd.nextInt(2);
        int poolPages = 4 + rnd.nextInt(7);
        // A sixth of the pools start a few ids before the lease counter's end, a sixth a few generations before the last.
        int serials = rnd.nextInt(6) == 0 ? 1 + rnd.nextInt(120) : -1;
        int generations = rnd.nextInt(6) == 0 ? 1 + rnd.nextInt(6) : -1;
        int claims = rnd.nextInt(8) == 0 ? 1 + rnd.nextInt(8) : -1; // an eighth run with a handful of claim slots
        FuzzTrace.Config config = new FuzzTrace.Config(lvl, qm, lag, poolPages, tenants, serials, generations, claims);
        boolean faulty = rnd.nextInt(3) == 0;
        int count = 3 + rnd.nextInt(6);
        List<RequestSpec> requests = new ArrayList<>();
        List<List<Event>> scripts = new ArrayList<>();
        for (int id = 1; id <= count; id++) {
            int tenant = rnd.nextInt(tenants);
            Kind kind = rnd.nextInt(5) < 2 ? Kind.HANDOFF : Kind.LOCAL;
            int tokens = 1 + rnd.nextInt(3 * FuzzTrace.PAGE_TOKENS);
            int pages = RequestSpec.pages(tokens);
            int prefix = kind == Kind.LOCAL && rnd.nextInt(2) == 0 ? rnd.nextInt(2) : -1;
            int drop = kind == Kind.HANDOFF && rnd.nextInt(5) == 0 ? rnd.nextInt(pages) : -1;
            RequestSpec r = new RequestSpec(id, tenant, kind, tokens, prefix, drop);
            requests.add(r);
            scripts.add(script(r, rnd));
        }
        return new FuzzTrace(config, requests, interleave(scripts, tenants, lvl.needsKeySource(), faulty, rnd));
    }

    /** One actor's own events in order: its steps (with slack for retries), a cancel, an ack, a timer. */
    private static List<Event> script(RequestSpec r, SplittableRandom rnd) {
        int pages = r.pages();
        // local: alloc, writes, read, finish, one late write; handoff: alloc, writes, begin, transfers, commit, read, finish, late write
        int steps = r.kind() == Kind.LOCAL ? pages + 4 : 2 * pages + 6;
        int transferEnd = 2 * pages + 2;
        steps += rnd.nextInt(4); // retries when the pool says "none"
        List<Event> s = new ArrayList<>();
        for (int i = 0; i < steps; i++) {
            s.add(new Event(Action.ADV, r.id()));
        }
        if (r.kind() == Kind.HANDOFF) {
            int ackRoll = rnd.nextInt(10);
            if (ackRoll < 8) {
                // Delivered, possibly late; "lost" (no ack) otherwise, and the drain delivers it.
                int at = Math.min(s.size(), transferEnd + rnd.nextInt(steps - transferEnd + 1) + (ackRoll == 0 ? -2 : 0));
                s.add(Math.max(0, at), new Event(Action.ACK, r.id()));
            }
            if (rnd.nextInt(5) == 0) {
                s.add(2 + rnd.nextInt(s.size() - 1), new Event(Action.EXPIRE, r.id()));
            }
        }
        if (rnd.nextInt(5) == 0) {
            s.add(rnd.nextInt(s.size() + 1), new Event(Action.CANCEL, r.id()));
        }
        for (int i = rnd.nextInt(3); i > 0; i--) {
            s.add(rnd.nextInt(s.size() + 1), new Event(Action.MISUSE, r.id(), rnd.nextInt(Misuse.VARIANTS)));
        }
        if (r.kind() == Kind.LOCAL && rnd.nextInt(r.prefix() >= 0 ? 3 : 10) == 0) {
            for (int i = 1 + rnd.nextInt(2); i > 0; i--) {
                s.add(rnd.nextInt(s.size() + 1), new Event(Action.UNMATCH, r.id()));
            }
        }
        if (rnd.nextInt(4) == 0) {
            s.add(rnd.nextInt(s.size() + 1), new Event(Action.CHURN, r.id(), 1 + rnd.nextInt(8)));
        }
        return s;
    }

    /**
     * A seeded merge of every actor's script (each keeps its order), with system events in between:
     * key operator events only when the level seals, backend faults only in {@code faulty} traces.
     */
    private static List<Event> interleave(List<List<Event>> scripts, int tenants, boolean seals, boolean faulty, SplittableRandom rnd) {
        List<Event> out = new ArrayList<>();
        int[] cursor = new int[scripts.size()];
        int remaining = scripts.stream().mapToInt(List::size).sum();
        // Requests arrive over time: actor k may start only after k * gap events.
        int gap = 1 + rnd.nextInt(4);
        while (remaining > 0) {
            int roll = rnd.nextInt(100);
            if (roll < 18) {
                out.add(new Event(Action.STEP, -1));
            } else if (roll < 24) {
                out.add(new Event(Action.PROTECT, -1));
            } else if (roll < 31) {
                out.add(new Event(Action.EVICT, rnd.nextInt(tenants)));
            } else if (roll < 33 && faulty) {
                out.add(new Event(Action.FAULT, -1, rnd.nextInt(8)));
            } else if (roll < 36 && seals) {
                int tenant = rnd.nextInt(tenants);
                out.add(rnd.nextInt(3) == 0 ? new Event(Action.RACE, tenant, rnd.nextInt(2))
                        : new Event(Action.RECLAIM, tenant, rnd.nextInt(12)));
            } else {
                int open = 0;
                for (int k = 0; k < scripts.size(); k++) {
                    if (cursor[k] < scripts.get(k).size() && k * gap <= out.size()) {
                        open++;
                    }
                }
                if (open == 0) {
                    out.add(new Event(Action.STEP, -1));
                    continue;
                }
                int pick = rnd.nextInt(open);
                for (int k = 0; k < scripts.size(); k++) {
                    if (cursor[k] < scripts.get(k).size() && k * gap <= out.size() && pick-- == 0) {
                        out.add(scripts.get(k).get(cursor[k]++));
                        remaining--;
                        break;
                    }
                }
            }
        }
        return out;
    }
}
