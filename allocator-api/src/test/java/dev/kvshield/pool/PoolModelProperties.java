package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Patterns;
import dev.kvshield.testing.PoolProbe;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.UnaryOperator;
import net.jqwik.api.Arbitraries;
import net.jqwik.api.Arbitrary;
import net.jqwik.api.ForAll;
import net.jqwik.api.Property;
import net.jqwik.api.Provide;
import net.jqwik.api.constraints.Size;

/**
 * Random sequences of allocate / write / claim / release / drop / fence / step against a plain
 * reference model of the life cycle (a deque free list, FIFO protection batches, claim counts).
 * After every step: same pages handed out, same states and generations, generations only grow,
 * counts add up, and every FREE page is all zero unless the level is NONE. Seeds are pinned.
 */
class PoolModelProperties {
    static final int PAGES = 10;

    sealed interface Action permits Allocate, Release, Write, Claim, Drop, Fence, Step {}

    record Allocate(int tenant, int count) implements Action {}

    record Release(int which) implements Action {}

    record Write(int which) implements Action {}

    record Claim(int which) implements Action {}

    record Drop(int which) implements Action {}

    record Fence(int which) implements Action {}

    record Step() implements Action {}

    @Provide
    Arbitrary<List<Action>> actions() {
        Arbitrary<Integer> index = Arbitraries.integers().between(0, 50);
        Arbitrary<Action> one = Arbitraries.frequencyOf(
                net.jqwik.api.Tuple.of(5, Arbitraries.integers().between(0, 2).flatMap(t -> Arbitraries.integers().between(1, 4)
                        .map(n -> (Action) new Allocate(t, n)))),
                net.jqwik.api.Tuple.of(4, index.map(i -> (Action) new Release(i))),
                net.jqwik.api.Tuple.of(3, index.map(i -> (Action) new Write(i))),
                net.jqwik.api.Tuple.of(2, index.map(i -> (Action) new Claim(i))),
                net.jqwik.api.Tuple.of(2, index.map(i -> (Action) new Drop(i))),
                net.jqwik.api.Tuple.of(1, index.map(i -> (Action) new Fence(i))),
                net.jqwik.api.Tuple.of(3, Arbitraries.just((Action) new Step())));
        return one.list().ofMinSize(1).ofMaxSize(80);
    }

    @Property(tries = 150, seed = "20261202")
    void zeroPoolMatchesTheModel(@ForAll("actions") @Size(max = 80) List<Action> actions) {
        run(actions, ProtectionLevel.ZERO, QuarantineMode.SYNCHRONOUS);
    }

    @Property(tries = 60, seed = "42")
    void asynchronousCompliancePoolMatchesTheModel(@ForAll("actions") List<Action> actions) {
        run(actions, ProtectionLevel.COMPLIANCE, QuarantineMode.ASYNCHRONOUS);
    }

    @Property(tries = 60, seed = "7")
    void nonePoolMatchesTheModel(@ForAll("actions") List<Action> actions) {
        run(actions, ProtectionLevel.NONE, QuarantineMode.SYNCHRONOUS);
    }

    record Own(int tenant, long request, long[] handles) {}

    record ModelClaim(long id, int page, boolean[] fenced) {}

    /** The reference model. */
    static final class Model {
        final Deque<Integer> free = new ArrayDeque<>();
        final List<int[]> queued = new ArrayList<>();
        final int[] generation = new int[PAGES];
        final PageState[] state = new PageState[PAGES];
        final int[] claims = new int[PAGES];
        final boolean[] awaiting = new boolean[PAGES];

        Model() {
            for (int p = 1; p < PAGES; p++) {
                free.addLast(p);
                state[p] = PageState.FREE;
                generation[p] = 1;
            }
        }

        int queuedPages() {
            return queued.stream().mapToInt(b -> b.length).sum();
        }

        void collect() {
            for (int[] batch : queued) {
                for (int i = batch.length - 1; i >= 0; i--) {
                    free.addFirst(batch[i]);
                    state[batch[i]] = PageState.FREE;
                }
            }
            queued.clear();
        }

        int[] allocate(int n) {
            // The pool drains its queue only when the drain meets the request: "none" changes nothing.
            if (free.size() < n && free.size() + queuedPages() >= n) {
                collect();
            }
            if (free.size() < n) {
                return null;
            }
            int[] pages = new int[n];
            for (int i = 0; i < n; i++) {
                pages[i] = free.pollFirst();
                state[pages[i]] = PageState.OWNED;
            }
            return pages;
        }

        void release(int[] pages) {
            List<Integer> batch = new ArrayList<>();
            for (int p : pages) {
                generation[p]++;
                state[p] = PageState.QUARANTINED;
                if (claims[p] > 0) {
                    awaiting[p] = true;
                } else {
                    batch.add(p);
                }
            }
            if (!batch.isEmpty()) {
                queued.add(batch.stream().mapToInt(Integer::intValue).toArray());
            }
        }

        void drop(int page) {
            if (--claims[page] == 0 && awaiting[page]) {
                awaiting[page] = false;
                queued.add(new int[] {page});
            }
        }
    }

    private static void run(List<Action> actions, ProtectionLevel level, QuarantineMode mode) {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(PAGES), level, c -> c.quarantineMode(mode), UnaryOperator.identity());
                Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            for (int i = 0; i < 3; i++) {
                pool.tenants().register("t" + i);
            }
            Model model = new Model();
            List<Own> owners = new ArrayList<>();
            List<ModelClaim> claims = new ArrayList<>();
            int[] lastGeneration = new int[PAGES];
            long request = 0;
            for (Action action : actions) {
                switch (action) {
                    case Allocate a -> {
                        long[] out = new long[a.count()];
                        long r = request++;
                        int[] expected = model.allocate(a.count());
                        boolean ok = pool.allocate(a.tenant(), Owners.request(r), LeaseKind.OWNER, a.count(), out, 0);
                        assertEquals(expected != null, ok, "allocate " + a + " model free=" + model.free + " " + pool.snapshot());
                        if (ok) {
                            assertArrayEquals(expected, PoolScenarioTest.pages(pool, out), "pages handed out");
                            for (long h : out) {
                                assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, pool.view().pageOf(h)))
                                        || level == ProtectionLevel.NONE, "hand-out of a non-zero page");
                            }
                            owners.add(new Own(a.tenant(), r, out));
                        }
                    }
                    case Release rel when !owners.isEmpty() -> {
                        Own o = owners.remove(rel.which() % owners.size());
                        model.release(PoolScenarioTest.pages(pool, o.handles()));
                        pool.release(o.tenant(), Owners.request(o.request()), o.handles(), 0, o.handles().length, ReleaseReason.FINISHED);
                    }
                    case Write w when !owners.isEmpty() -> {
                        Own o = owners.get(w.which() % owners.size());
                        long h = o.handles()[w.which() % o.handles().length];
                        for (int b = 0; b < pool.geometry().bufferCount(); b++) {
                            pool.write(o.tenant(), Owners.request(o.request()), h, b, 0,
                                    Patterns.fill(arena, pool.geometry().pageBytes(b), o.tenant(), o.request(), pool.view().pageOf(h), b));
                        }
                    }
                    case Claim c when !owners.isEmpty() -> {
                        Own o = owners.get(c.which() % owners.size());
                        long h = o.handles()[c.which() % o.handles().length];
                        long id = Leases.claim(pool, o.tenant(), Owners.request(o.request()), h, ClaimKind.WRITER, o.request());
                        model.claims[pool.view().pageOf(h)]++;
                        claims.add(new ModelClaim(id, pool.view().pageOf(h), new boolean[1]));
                    }
                    case Drop d when !claims.isEmpty() -> {
                        ModelClaim c = claims.remove(d.which() % claims.size());
                        Leases.dropClaims(pool, new long[] {c.id()}, 0, 1);
                        model.drop(c.page());
                    }
                    case Fence f when !claims.isEmpty() -> {
                        ModelClaim c = claims.get(f.which() % claims.size());
                        Leases.fence(pool, c.id());
                        c.fenced()[0] = true;
                        long digest = pool.stateDigest();
                        assertThrows(FencedLeaseException.class,
                                () -> Leases.write(pool, c.id(), 0, 0, arena.allocate(pool.geometry().bytesPerToken(0))));
                        assertEquals(digest, pool.stateDigest());
                    }
                    case Step s -> {
                        pool.endStep();
                        model.collect();
                    }
                    default -> { }
                }
                checkInvariants(t, arena, model, level, lastGeneration);
            }
        }
    }

    private static void checkInvariants(TestPools t, Arena arena, Model model, ProtectionLevel level, int[] lastGeneration) {
        KvPagePool pool = t.pool;
        PoolSnapshot s = pool.snapshot();
        assertEquals(PAGES - 1, s.total(), "counts add up: " + s);
        assertEquals(model.free.size() + model.queuedPages(), pool.available(), "available: " + s);
        assertEquals(model.free.size(), s.free(), "free: " + s);
        Map<PageState, Integer> count = new HashMap<>();
        for (int p = 1; p < PAGES; p++) {
            assertEquals(model.state[p], pool.view().stateOf(p), "state of page " + p);
            assertEquals(model.generation[p], pool.view().generationOf(p), "generation of page " + p);
            assertTrue(pool.view().generationOf(p) >= lastGeneration[p], "generation went backwards on page " + p);
            lastGeneration[p] = pool.view().generationOf(p);
            count.merge(model.state[p], 1, Integer::sum);
            if (model.state[p] == PageState.FREE && level != ProtectionLevel.NONE) {
                assertTrue(Patterns.allZero(PoolProbe.rawPage(t.memory, arena, p)), "FREE page " + p + " holds data");
            }
        }
        assertEquals(count.getOrDefault(PageState.OWNED, 0), s.owned());
        assertEquals(count.getOrDefault(PageState.QUARANTINED, 0), s.quarantined());
    }
}
