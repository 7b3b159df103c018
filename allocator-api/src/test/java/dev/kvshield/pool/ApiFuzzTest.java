package dev.kvshield.pool;

import dev.kvshield.testing.Leases;
import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.function.UnaryOperator;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Bad input, nothing lost: random calls on every public entry point of the pool with a mix of
 * valid, boundary and hostile arguments (negative, zero, huge, unknown tenants, stale, foreign and
 * garbage handles and claim ids, wrong owners, wrong sizes). Each call either succeeds or fails with
 * a kvshield or argument exception whose message is not blank, and a failed call leaves the state
 * digest exactly as it was. After every call, every lease the model believes held is still live,
 * the pages they hold are exactly the OWNED pages, and the page counts add up. Seeds are pinned; a failure names seed and call number.
 */
class ApiFuzzTest {
    record Own(int tenant, long owner, long handle) {}

    @ParameterizedTest
    @ValueSource(longs = {1L, 2L, 3L, 20261202L})
    void everyCallSucceedsOrFailsCleanlyWithoutChangingState(long seed) {
        try (TestPools t = TestPools.create(TestPools.tinyGeometry(12), ProtectionLevel.ZERO,
                c -> c.quarantineMode(seed % 2 == 0 ? QuarantineMode.ASYNCHRONOUS : QuarantineMode.SYNCHRONOUS),
                UnaryOperator.identity()); Arena arena = Arena.ofConfined()) {
            KvPagePool pool = t.pool;
            pool.tenants().register("a");
            pool.tenants().register("b");
            SplittableRandom r = new SplittableRandom(seed);
            List<Own> owned = new ArrayList<>();
            List<Long> stale = new ArrayList<>();
            List<Long> claims = new ArrayList<>();
            long[] longs = {0, -1, 1, Long.MIN_VALUE, Long.MAX_VALUE, Integer.MAX_VALUE, PageHandles.encode(11, 1),
                    PageHandles.encode(12, 1), PageHandles.encode(3, 1_000_000)};
            int[] ints = {0, -1, 1, 2, 3, 4, 5, Integer.MAX_VALUE, Integer.MIN_VALUE, 64};
            int bpt = pool.geometry().bytesPerToken(0);
            int[] succeeded = new int[17];
            for (int call = 0; call < 3000; call++) {
                String where = "seed " + seed + " call " + call;
                int tenant = r.nextInt(8) == 0 ? pick(r, ints) : r.nextInt(2);
                long owner = r.nextInt(8) == 0 ? pick(r, longs) : Owners.request(r.nextInt(4));
                Own mine = owned.isEmpty() ? null : owned.get(r.nextInt(owned.size()));
                long handle = switch (r.nextInt(4)) {
                    case 0 -> mine != null ? mine.handle() : pick(r, longs);
                    case 1 -> stale.isEmpty() ? pick(r, longs) : stale.get(r.nextInt(stale.size()));
                    case 2 -> pick(r, longs);
                    default -> r.nextLong();
                };
                if (mine != null && r.nextBoolean()) {
                    tenant = mine.tenant();
                    owner = mine.owner();
                }
                long claim = claims.isEmpty() || r.nextInt(4) == 0 ? pick(r, longs) : claims.get(r.nextInt(claims.size()));
                int count = r.nextInt(6) == 0 ? pick(r, ints) : r.nextInt(4);
                int slot = r.nextInt(6) == 0 ? pick(r, ints) : r.nextInt(4);
                int buffer = r.nextInt(6) == 0 ? pick(r, ints) : r.nextInt(4);
                MemorySegment bytes = arena.allocate(r.nextInt(6) == 0 ? 1 + r.nextInt(40) : bpt * (1 + r.nextInt(2)));
                long before = pool.stateDigest();
                int op = r.nextInt(17);
                try {
                    final int ft = tenant;
                    final long fo = owner;
                    switch (op) {
                        case 0 -> {
                            long[] out = new long[Math.max(0, Math.min(count, 8))];
                            if (pool.allocate(ft, fo, LeaseKind.OWNER, count, out, 0)) {
                                for (int i = 0; i < count; i++) {
                                    owned.add(new Own(ft, fo, out[i]));
                                }
                            }
                        }
                        case 1 -> {
                            pool.release(ft, fo, new long[] {handle}, 0, 1, ReleaseReason.FINISHED);
                            owned.removeIf(o -> o.handle() == handle);
                            stale.add(handle);
                        }
                        case 2 -> pool.write(ft, fo, handle, buffer, slot, bytes);
                        case 3 -> pool.read(ft, fo, handle, buffer, slot, bytes);
                        case 4 -> pool.markWritten(ft, fo, handle, slot, slot + count);
                        case 5 -> claims.add(Leases.claim(pool, ft, fo, handle, r.nextBoolean() ? ClaimKind.WRITER : ClaimKind.READER, 1));
                        case 6 -> Leases.write(pool, claim, buffer, slot, bytes);
                        case 7 -> Leases.read(pool, claim, buffer, slot, bytes);
                        case 8 -> Leases.fence(pool, claim);
                        case 9 -> {
                            Leases.dropClaims(pool, new long[] {claim}, 0, 1);
                            claims.remove(claim);
                        }
                        case 10 -> {
                            long[] back = new long[1];
                            if (pool.reclaim(ft, fo, LeaseKind.OWNER, new long[] {handle}, 0, 1, back, 0) == 1) {
                                owned.add(new Own(ft, fo, back[0]));
                            }
                        }
                        case 11 -> {
                            long to = Owners.request(r.nextInt(4));
                            long[] moved = new long[1];
                            pool.transfer(ft, fo, new long[] {handle}, 0, 1, LeaseKind.OWNER, to, moved, 0);
                            owned.replaceAll(o -> o.handle() == handle ? new Own(o.tenant(), to, moved[0]) : o);
                            stale.add(handle);
                        }
                        case 12 -> {
                            long reader = r.nextInt(3) == 0 ? pick(r, longs) : r.nextInt(4);
                            owned.add(new Own(ft, reader, Leases.addReader(pool, ft, fo, handle, reader)));
                        }
                        case 13 -> pool.view().isWritten(handle, slot, slot + count);
                        case 14 -> pool.admit(r.nextInt(3) == 0 ? pick(r, longs) : r.nextInt(64));
                        case 15 -> pool.release(ft, fo, new long[] {handle, handle}, r.nextInt(3), count, ReleaseReason.ABORTED);
                        default -> pool.endStep();
                    }
                    succeeded[op]++;
                } catch (KvShieldException | IllegalArgumentException e) {
                    assertTrue(e.getMessage() != null && !e.getMessage().isBlank(), where + ": blank message from " + e);
                    assertEquals(before, pool.stateDigest(), where + ": rejected op " + op + " changed the pool: " + e.getMessage());
                } catch (RuntimeException e) {
                    fail(where + ": op " + op + " failed without a clear kvshield error", e);
                }
                owned.removeIf(o -> !pool.view().isLive(o.handle()) && stale.add(o.handle()));
                PoolSnapshot s = pool.snapshot();
                assertEquals(11, s.total(), where + ": " + s);
                assertEquals(owned.stream().mapToInt(o -> pool.view().pageOf(o.handle())).distinct().count(), s.owned(),
                        where + ": model and pool disagree on owned pages");
                assertFalse(s.available() < 0 || s.available() > 11, where);
            }
            for (int op : new int[] {0, 1, 2, 4, 5, 6, 8, 9, 11, 12, 13, 14, 16}) {
                assertTrue(succeeded[op] > 0, "seed " + seed + ": op " + op + " never succeeded; the fuzzer only tested rejections");
            }
        }
    }

    private static int pick(SplittableRandom r, int[] values) {
        return values[r.nextInt(values.length)];
    }

    private static long pick(SplittableRandom r, long[] values) {
        return values[r.nextInt(values.length)];
    }
}
