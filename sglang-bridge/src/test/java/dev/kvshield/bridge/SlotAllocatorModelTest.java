package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvshield.KvShieldException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.PoolSnapshot;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.TenantPolicy;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The slot allocator against a model of who holds each page, after every call of a seeded random run:
 * allocations of one to three plan rows (alloc and allocExtend) up to the pool and the quotas, frees and
 * one-call releases of a request's own slots mixed with another's, a freed, a deferred or page 0's slot,
 * a slot named twice, another slot of an own page, slots outside the pool, inside and outside SGLang's
 * free group, strict and production mode, page sizes 1, 2 and 4. After each call: every page's state,
 * tenant and request, each request's page list, each tenant's owned count, the pool's counts and
 * available tokens, the refusals counted, the bytes of every owned page, a "none" answer's shortfall
 * (tenant, pages asked, pages available, owned count, quota), and once protected, a ZERO tenant's
 * released page reads zero (also when handed out again). Fails with the token free's all-held shortcut
 * taken for a free that names a slot twice.
 */
class SlotAllocatorModelTest {
    private static final int PAGES = 24;
    private static final int REQUESTS = 7;

    @Timeout(value = 60, threadMode = Timeout.ThreadMode.SEPARATE_THREAD)
    @ParameterizedTest
    @CsvSource({"1,false,1", "1,true,2", "2,false,3", "2,true,4", "4,false,5", "1,false,6"})
    void randomOps(int ps, boolean strict, long seed) {
        PoolGeometry g = PoolGeometry.builder().mha(1, 1, 1, 4).pageSizeTokens(ps).pageCount(PAGES).build();
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g)) {
            ByteBuffer ioBytes = ByteBuffer.allocateDirect(PAGES * ps * 8).order(ByteOrder.nativeOrder());
            ByteBuffer planBytes = ByteBuffer.allocateDirect(4 * SlotAllocator.PLAN_ROW * 8).order(ByteOrder.nativeOrder());
            LongBuffer io = ioBytes.asLongBuffer();
            LongBuffer plan = planBytes.asLongBuffer();
            try (SlotAllocator a = SlotAllocator.create(Map.of("advertisedContextTokens", "32", "strict", Boolean.toString(strict),
                    "level", "NONE"), g, memory)) {
                a.bind(ioBytes, planBytes);
                int[] tenants = {
                    a.pool().tenants().register("open"),
                    a.pool().tenants().register("scrub", new TenantPolicy(9, ProtectionLevel.ZERO, false)),
                    a.pool().tenants().register("tight", new TenantPolicy(5, ProtectionLevel.ZERO, false)),
                };
                boolean[] zeroes = {false, true, true};
                int[] quotas = {-1, 9, 5};
                new Model(a, memory, g, io, plan, ps, strict, tenants, zeroes, quotas, new Random(seed)).run(1500);
            }
        }
    }

    static final class Model {
        final SlotAllocator a;
        final OffHeapPageMemory memory;
        final PoolGeometry g;
        final LongBuffer io;
        final LongBuffer plan;
        final int ps;
        final boolean strict;
        final int[] tenants;
        final boolean[] zeroes;
        final int[] quotas;
        final Random rnd;
        // per page: owning request (-1 none), deferred flag, pattern byte, last releaser tenant index
        final int[] owner = new int[PAGES];
        final boolean[] deferred = new boolean[PAGES];
        final byte[] pattern = new byte[PAGES];
        final int[] lastTenantIdx = new int[PAGES];
        final boolean[] protectedDue = new boolean[PAGES];
        final int[] reqTenant = new int[REQUESTS + 1];
        final int[] reqTokens = new int[REQUESTS + 1];
        final long[] nextReqId = new long[REQUESTS + 1];
        long idBase = 1;
        long rejected;
        boolean groupOpen;
        int bytePattern = 1;

        Model(SlotAllocator a, OffHeapPageMemory memory, PoolGeometry g, LongBuffer io, LongBuffer plan, int ps, boolean strict,
                int[] tenants, boolean[] zeroes, int[] quotas, Random rnd) {
            this.a = a;
            this.memory = memory;
            this.g = g;
            this.io = io;
            this.plan = plan;
            this.ps = ps;
            this.strict = strict;
            this.tenants = tenants;
            this.zeroes = zeroes;
            this.quotas = quotas;
            this.rnd = rnd;
            java.util.Arrays.fill(owner, -1);
            java.util.Arrays.fill(lastTenantIdx, -1);
            for (int r = 1; r <= REQUESTS; r++) {
                reqTenant[r] = rnd.nextInt(3);
                nextReqId[r] = idBase++;
            }
        }

        long id(int r) {
            return nextReqId[r];
        }

        void run(int ops) {
            for (int op = 0; op < ops; op++) {
                int k = rnd.nextInt(100);
                String what;
                if (k < 35) {
                    what = "alloc";
                    alloc(1 + rnd.nextInt(rnd.nextInt(3) + 1), rnd.nextBoolean());
                } else if (k < 70) {
                    what = "free";
                    free(1 + rnd.nextInt(REQUESTS), false);
                } else if (k < 78) {
                    what = "release";
                    free(1 + rnd.nextInt(REQUESTS), true);
                } else if (k < 84) {
                    what = "group";
                    if (groupOpen) {
                        a.endFreeGroup(0);
                        for (int p = 1; p < PAGES; p++) {
                            if (deferred[p]) {
                                releasedPage(p);
                            }
                        }
                        groupOpen = false;
                    } else {
                        groupOpen = true;
                    }
                } else {
                    what = "step";
                    a.endStep();
                    for (int p = 1; p < PAGES; p++) {
                        if (protectedDue[p] && owner[p] < 0) {
                            assertEquals(PageState.FREE, a.pool().view().stateOf(p), "page " + p);
                            if (zeroes[lastTenantIdx[p]]) {
                                assertTrue(allBytes(p, (byte) 0), "ZERO tenant's released page " + p + " reads zero");
                            }
                            protectedDue[p] = false;
                        }
                    }
                }
                check(op + " " + what);
            }
        }

        void releasedPage(int p) {
            lastTenantIdx[p] = reqTenant[owner[p]];
            owner[p] = -1;
            deferred[p] = false;
            protectedDue[p] = true;
        }

        int ownedBy(int ti) {
            int n = 0;
            for (int p = 1; p < PAGES; p++) {
                n += owner[p] >= 0 && reqTenant[owner[p]] == ti ? 1 : 0;
            }
            return n;
        }

        int ownedAll() {
            int n = 0;
            for (int p = 1; p < PAGES; p++) {
                n += owner[p] >= 0 ? 1 : 0;
            }
            return n;
        }

        /** One allocation of {@code rows} plan rows (distinct requests), by alloc or allocExtend. */
        void alloc(int rows, boolean extend) {
            List<Integer> reqs = new ArrayList<>();
            for (int r = 1; r <= REQUESTS; r++) {
                reqs.add(r);
            }
            Collections.shuffle(reqs, rnd);
            int[] rs = new int[rows];
            int[] want = new int[rows];
            int total = 0;
            for (int i = 0; i < rows; i++) {
                rs[i] = reqs.get(i);
                want[i] = 1 + rnd.nextInt(rnd.nextInt(4) + 1);
                if (reqTokens[rs[i]] + (long) want[i] * ps > (long) PAGES * ps) {
                    return;
                }
                plan.put(i * SlotAllocator.PLAN_ROW, new long[] {id(rs[i]), tenants[reqTenant[rs[i]]], reqTokens[rs[i]],
                    reqTokens[rs[i]] + (long) want[i] * ps, -1});
                total += want[i];
            }
            int available = PAGES - 1 - ownedAll();
            int shortTenant = -1;
            int asked = 0;
            for (int i = 0; i < rows && shortTenant < 0; i++) {
                int ti = reqTenant[rs[i]];
                asked = 0;
                for (int j = 0; j < rows; j++) {
                    asked += reqTenant[rs[j]] == ti ? want[j] : 0;
                }
                shortTenant = quotas[ti] >= 0 && ownedBy(ti) + asked > quotas[ti] ? ti : -1;
            }
            long slots = (long) total * ps;
            long got = extend ? a.allocExtend(rows, slots, 0) : a.alloc(slots, rows, 0);
            if (shortTenant >= 0 || available < total) {
                assertEquals(-1, got, "expected none");
                String why = a.pool().lastShortfall();
                if (shortTenant >= 0) {
                    assertTrue(why.startsWith("quota exhausted: tenant " + tenants[shortTenant] + " asked for " + asked + " pages"), why);
                    assertTrue(why.contains("owns " + ownedBy(shortTenant) + " of a quota of " + quotas[shortTenant]), why);
                } else {
                    assertTrue(why.startsWith("pool exhausted: tenant " + tenants[reqTenant[rs[0]]] + " asked for " + total + " pages"),
                            why);
                }
                assertTrue(why.contains("with " + available + " available"), why);
                assertTrue(why.contains(" owned=" + ownedAll() + " "), why);
                return;
            }
            assertEquals(slots, got);
            int o = 0;
            for (int i = 0; i < rows; i++) {
                int r = rs[i];
                for (int k = 0; k < want[i]; k++, o++) {
                    long base = io.get(o * ps);
                    assertEquals(0, base % ps);
                    int p = (int) (base / ps);
                    for (int s = 0; s < ps; s++) {
                        assertEquals(base + s, io.get(o * ps + s));
                    }
                    assertEquals(-1, owner[p], "page " + p + " handed out while owned by " + owner[p]);
                    if (lastTenantIdx[p] >= 0 && zeroes[lastTenantIdx[p]]) {
                        assertTrue(allBytes(p, (byte) 0), "page " + p + " of a ZERO tenant handed out unzeroed");
                    }
                    assertEquals(p, a.pageAt(id(r), reqTokens[r] / ps + k), "request " + r + "'s page list");
                    owner[p] = r;
                    protectedDue[p] = false;
                    pattern[p] = (byte) (bytePattern++ % 250 + 1);
                    fill(p, pattern[p]);
                }
                reqTokens[r] += want[i] * ps;
            }
        }

        void free(int r, boolean release) {
            int ti = reqTenant[r];
            List<Long> slots = new ArrayList<>();
            int expectRefused = 0;
            List<Integer> mine = new ArrayList<>();
            for (int p = 1; p < PAGES; p++) {
                if (owner[p] == r && !deferred[p]) {
                    mine.add(p);
                }
            }
            Collections.shuffle(mine, rnd);
            int take = mine.isEmpty() ? 0 : rnd.nextInt(mine.size() + 1);
            List<Integer> freedMine = new ArrayList<>(mine.subList(0, take));
            for (int p : freedMine) {
                addPageSlots(slots, p);
            }
            java.util.Set<Integer> badPages = new java.util.HashSet<>();
            int extras = rnd.nextInt(3);
            boolean outOfRange = false;
            for (int e = 0; e < extras; e++) {
                int kind = rnd.nextInt(6);
                if (kind == 0) { // any other page (foreign, free, deferred, page 0)
                    int p = rnd.nextInt(PAGES);
                    if (owner[p] == r && !deferred[p]) {
                        continue;
                    }
                    addPageSlots(slots, p);
                    if (badPages.add(p)) {
                        expectRefused++;
                    } else if (ps == 1) {
                        expectRefused++;
                    }
                } else if (kind == 1 && !slots.isEmpty()) { // same slot twice
                    long s = slots.get(rnd.nextInt(slots.size()));
                    slots.add(s);
                    if (ps == 1) {
                        expectRefused++;
                    }
                } else if (kind == 2 && rnd.nextInt(10) == 0) {
                    slots.add(rnd.nextBoolean() ? -1L - rnd.nextInt(3) : (long) PAGES * ps + rnd.nextInt(3));
                    outOfRange = true;
                } else if (kind == 3 && ps > 1 && !freedMine.isEmpty()) { // one more slot of an own page
                    slots.add((long) freedMine.get(0) * ps + rnd.nextInt(ps));
                }
            }
            Collections.shuffle(slots, rnd);
            io.put(0, slots.stream().mapToLong(Long::longValue).toArray());
            long digest = a.pool().stateDigest();
            int n = slots.size();
            if (outOfRange) {
                assertThrows(IllegalArgumentException.class, () -> call(release, n, ti, r));
                assertEquals(digest, a.pool().stateDigest());
                return;
            }
            if (strict && expectRefused > 0) {
                boolean hadGroupFrees = release && hasDeferred(r) && !groupOpen;
                assertThrows(KvShieldException.class, () -> call(release, n, ti, r));
                rejected += expectRefused;
                if (!hadGroupFrees) {
                    assertEquals(digest, a.pool().stateDigest(), "strict refusal changed the pool");
                } else {
                    for (int p = 1; p < PAGES; p++) {
                        if (owner[p] == r && deferred[p]) {
                            releasedPage(p);
                        }
                    }
                }
                return;
            }
            int got = call(release, n, ti, r);
            assertEquals(expectRefused, got, "refused of " + slots + " by " + r);
            rejected += got;
            boolean inGroup = groupOpen;
            for (int p : freedMine) {
                if (inGroup) {
                    deferred[p] = true;
                } else {
                    releasedPage(p);
                }
            }
            if (release && !groupOpen) {
                for (int p = 1; p < PAGES; p++) {
                    if (owner[p] == r) {
                        releasedPage(p);
                    }
                }
                reqTokens[r] = 0;
                reqTenant[r] = rnd.nextInt(3);
                nextReqId[r] = idBase++;
            }
        }

        boolean hasDeferred(int r) {
            for (int p = 1; p < PAGES; p++) {
                if (owner[p] == r && deferred[p]) {
                    return true;
                }
            }
            return false;
        }

        int call(boolean release, int n, int ti, int r) {
            if (release && !groupOpen) {
                return a.releaseRequest(n, tenants[ti], id(r), true, 0);
            }
            return a.free(n, tenants[ti], id(r), groupOpen ? SlotAllocator.IN_FREE_GROUP : 0);
        }

        void addPageSlots(List<Long> slots, int p) {
            for (int k = 0; k < ps; k++) {
                slots.add((long) p * ps + k);
            }
        }

        void fill(int p, byte b) {
            for (int buffer = 0; buffer < g.bufferCount(); buffer++) {
                memory.hostRegion(p, buffer).fill(b);
            }
        }

        boolean allBytes(int p, byte b) {
            for (int buffer = 0; buffer < g.bufferCount(); buffer++) {
                MemorySegment m = memory.hostRegion(p, buffer);
                for (byte x : m.toArray(ValueLayout.JAVA_BYTE)) {
                    if (x != b) {
                        return false;
                    }
                }
            }
            return true;
        }

        void check(String where) {
            int total = 0;
            for (int p = 1; p < PAGES; p++) {
                PageState s = a.pool().view().stateOf(p);
                if (owner[p] >= 0) {
                    total++;
                    assertEquals(PageState.OWNED, s, where + " page " + p);
                    assertEquals(tenants[reqTenant[owner[p]]], a.tenantOf(p), where + " page " + p);
                    assertEquals(deferred[p] ? -1 : id(owner[p]), a.requestOf(p), where + " page " + p);
                    if (!allBytes(p, pattern[p])) {
                        fail(where + ": owned page " + p + " lost its bytes");
                    }
                } else if (s == PageState.OWNED) {
                    fail(where + ": page " + p + " owned but model says free; tenant " + a.tenantOf(p) + " request " + a.requestOf(p));
                }
            }
            for (int ti = 0; ti < 3; ti++) {
                assertEquals(ownedBy(ti), a.pool().ownedBy(tenants[ti]), where + " ownedBy " + ti);
            }
            PoolSnapshot snap = a.pool().snapshot();
            assertEquals(total, snap.owned(), where);
            assertEquals(PAGES - 1, snap.total(), where);
            assertEquals(PAGES - 1 - total, snap.available(), where);
            assertEquals((long) (PAGES - 1 - total) * ps, a.availableTokens(), where);
            for (int r = 1; r <= REQUESTS; r++) {
                int held = 0;
                for (int p = 1; p < PAGES; p++) {
                    held += owner[p] == r && !deferred[p] ? 1 : 0;
                }
                assertEquals(held, a.heldPages(id(r)), where + " held " + r);
            }
            assertEquals(rejected, a.rejectedFrees(), where);
        }
    }
}
