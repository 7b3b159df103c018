package dev.kvshield.perf.fuzz;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.KvShieldException;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Bad input on the handoff entry points (the pool's own are fuzzed by allocator-api's
 * {@code ApiFuzzTest}): hostile tenants, token counts, page indices, slots, source handle arrays,
 * unknown peers, reservations and transfers of another pool or already ended. Each call succeeds
 * or fails with a kvshield, argument or state exception with a message; a failed call leaves the
 * pool's state digest exactly as it was. Seeds pinned; a failure names seed and call.
 */
class HandoffApiFuzzTest {
    static final long PEER = 5;

    @ParameterizedTest
    @ValueSource(longs = {1L, 2L, 20261202L})
    void everyHandoffCallSucceedsOrFailsCleanlyWithoutChangingState(long seed) {
        PoolGeometry g = TraceRunner.geometry(9);
        AdmissionPolicy admission = new AdmissionPolicy(g.capacityTokens(), 0, false);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g); OffHeapPageMemory otherMemory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO).admission(admission).maxClaims(6)
                        .build(), memory);
                KvPagePool other = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO).admission(admission).build(),
                        otherMemory);
                Arena arena = Arena.ofConfined()) {
            int a = pool.tenants().register("a");
            pool.tenants().register("b");
            other.tenants().register("a");
            HandoffSender sender = new HandoffSender(pool);
            HandoffReceiver receiver = new HandoffReceiver(pool, alarm -> { });
            HandoffReceiver foreignReceiver = new HandoffReceiver(other, alarm -> { });
            sender.handshake(PEER, receiver.effectiveLimitTokens());
            receiver.handshake(PEER, sender.effectiveLimitTokens());
            foreignReceiver.handshake(PEER, sender.effectiveLimitTokens());
            SplittableRandom r = new SplittableRandom(seed);
            List<HandoffSender.Transfer> transfers = new ArrayList<>();
            List<Reservation> reservations = new ArrayList<>();
            List<long[]> sources = new ArrayList<>();
            long[] tokenValues = {-1, 0, 1, 4, 5, 12, 28, 29, Long.MAX_VALUE, Long.MIN_VALUE};
            int[] ints = {-1, 0, 1, 2, 3, 4, 7, Integer.MAX_VALUE, Integer.MIN_VALUE};
            int succeeded = 0;
            for (int call = 0; call < 1500; call++) {
                String where = "seed " + seed + " call " + call;
                int tenant = r.nextInt(6) == 0 ? ints[r.nextInt(ints.length)] : r.nextInt(2);
                long request = 1 + r.nextInt(5);
                long tokens = r.nextInt(3) == 0 ? tokenValues[r.nextInt(tokenValues.length)] : 1 + r.nextInt(12);
                int index = r.nextInt(5) == 0 ? ints[r.nextInt(ints.length)] : r.nextInt(3);
                int slot = r.nextInt(5) == 0 ? ints[r.nextInt(ints.length)] : r.nextInt(4);
                int buffer = r.nextInt(5) == 0 ? ints[r.nextInt(ints.length)] : r.nextInt(2);
                long peer = r.nextInt(5) == 0 ? 99 : PEER;
                MemorySegment bytes = arena.allocate(r.nextInt(5) == 0 ? 1 + r.nextInt(40) : 16L * (1 + r.nextInt(4)));
                HandoffSender.Transfer t = transfers.isEmpty() ? null : transfers.get(r.nextInt(transfers.size()));
                Reservation res = reservations.isEmpty() ? null : reservations.get(r.nextInt(reservations.size()));
                long before = pool.stateDigest();
                int op = r.nextInt(12);
                try {
                    switch (op) {
                        case 0 -> {
                            long[] h = new long[1 + r.nextInt(3)];
                            if (pool.allocate(r.nextInt(2), Owners.request(request), LeaseKind.OWNER, h.length, h, 0)) {
                                sources.add(h);
                            }
                        }
                        case 1 -> {
                            long[] src = sources.isEmpty() || r.nextInt(4) == 0 ? new long[] {r.nextLong()}
                                    : sources.get(r.nextInt(sources.size()));
                            transfers.add(sender.begin(tenant, request, tokens, src, peer));
                        }
                        case 2 -> {
                            Reservation got = (r.nextInt(4) == 0 ? foreignReceiver : receiver).reserve(tenant, request, tokens, peer);
                            if (got != null) {
                                reservations.add(got);
                            }
                        }
                        case 3 -> sender.read(t, index, buffer, slot, bytes);
                        case 4 -> sender.markSent(t, tokens);
                        case 5 -> sender.complete(t);
                        case 6 -> receiver.write(res, index, buffer, slot, bytes);
                        case 7 -> receiver.recordWritten(res, index, slot, slot + index);
                        case 8 -> receiver.commit(res, tokens);
                        case 9 -> receiver.abort(res);
                        case 10 -> receiver.acknowledge(res);
                        default -> receiver.expire(res);
                    }
                    succeeded++;
                } catch (KvShieldException | IllegalArgumentException | IllegalStateException | NullPointerException e) {
                    if (e instanceof NullPointerException && (t == null || res == null)) {
                        continue; // the fuzzer passed no transfer or reservation at all
                    }
                    String message = e.getMessage();
                    assertTrue(message != null && !message.isBlank(), where + " op " + op + ": " + e + " has no message");
                    assertEquals(before, pool.stateDigest(), where + " op " + op + ": rejected with '" + message
                            + "' but changed the pool");
                }
            }
            // Enough successes that the run is not only rejections; reservations of the foreign pool are refused by design.
            assertTrue(succeeded > 200, "calls that succeeded: " + succeeded);
        }
    }

    /** A reservation refused for want of claim slots must leave the pool as it was (no page allocated and released). */
    @org.junit.jupiter.api.Test
    void aReservationWithoutClaimSlotsChangesNothing() {
        PoolGeometry g = TraceRunner.geometry(9);
        AdmissionPolicy admission = new AdmissionPolicy(g.capacityTokens(), 0, false);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.ZERO).admission(admission).maxClaims(2)
                        .build(), memory)) {
            int a = pool.tenants().register("a");
            HandoffReceiver receiver = new HandoffReceiver(pool, alarm -> { });
            receiver.handshake(PEER, receiver.effectiveLimitTokens());
            long before = pool.stateDigest();
            KvShieldException e = org.junit.jupiter.api.Assertions.assertThrows(KvShieldException.class,
                    () -> receiver.reserve(a, 1, 12, PEER));
            assertTrue(e.getMessage().contains("claim"), e.getMessage());
            assertEquals(before, pool.stateDigest(), "a refused reservation changed the pool");
        }
    }
}
