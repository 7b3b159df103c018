package dev.kvshield.keys;

import static dev.kvshield.keys.EncryptFixture.SMALL;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.keys.cipher.BouncyChaCha;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Leases;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.function.Function;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.opentest4j.AssertionFailedError;

/**
 * Property: over random seal / reclaim / reuse / rotation / retirement / restart sequences across
 * two pools x two tensor-parallel ranks (ranks of one pool receive identical calls, so their page
 * ids and generations coincide, as do those of a pool before and after a restart), no
 * (key, nonce, block counter) is ever used twice. Every seal is observed from the bytes: the
 * keystream read back ({@code plaintext XOR memory}) must equal the RFC 8439 keystream of the
 * documented (key, nonce, counter), and no 64-byte keystream block may repeat anywhere.
 */
class NonceUniquenessPropertyTest {
    private static final long[] SEEDS = {0xC0FFEEL, 20260101L, 7L};
    private static final int OPERATIONS = 160;
    private static final String[] POOLS = {"pool-a", "pool-b"};
    private static final int RANKS = 2;
    private static final long OWNER = Owners.request(1);

    @TempDir
    Path dir;

    /** One observed seal: the tuple the pool reported and the keystream the bytes show. */
    private record Observation(String keyHex, int page, int generation, int buffer, byte[] keystream, long seed, int step) {}

    /** One pool instance (one rank of one pool id, for one boot). */
    private static final class Slot {
        final String poolId;
        final int rank;
        KvPagePool pool;
        PageMemory memory;
        EncryptFixture.Events events;
        int seen; // events consumed so far
        final Map<Integer, Integer> plaintextSeedOfPage = new HashMap<>();
        final List<long[]> sealedRefs = new ArrayList<>(); // {tenant, ref}
        final List<long[]> owned = new ArrayList<>(); // {tenant, lease}

        Slot(String poolId, int rank) {
            this.poolId = poolId;
            this.rank = rank;
        }
    }

    @Test
    void noKeyNonceCounterIsEverUsedTwice() {
        for (long seed : SEEDS) {
            RootKeySource source = RootKeySource.keyFile(TestKeys.keyFile(dir, "k" + seed, TestKeys.sequential(32, (int) seed), "rw-------"));
            HostPageSealerFactory factory = new HostPageSealerFactory(source);
            List<Observation> observations = run(seed, factory, f -> factory.keyring(f.poolId, f.rank));
            verify(observations, seed);
            assertTrue(observations.size() > 500, "seed " + seed + ": too few seals observed (" + observations.size() + ")");
            assertCoincidencesHappened(observations, seed);
        }
    }

    @Test
    void plantedBugANonceWithoutTheGenerationIsCaught() {
        long seed = SEEDS[0];
        RootKeySource source = RootKeySource.keyFile(TestKeys.keyFile(dir, "planted", TestKeys.sequential(32, 1), "rw-------"));
        // The planted sealer keeps its keyring to itself; the repeat check needs no key, only keystream bytes.
        List<Observation> observations = run(seed, PlantedBugs.sealerIgnoringTheGeneration(source), slot -> null);
        AssertionFailedError e = assertThrows(AssertionFailedError.class, () -> verifyNoRepeatedKeystream(observations, seed));
        assertTrue(e.getMessage().contains("repeated"), e.getMessage());
    }

    /** Runs one random sequence; {@code keyringOf} gives a slot's keyring (null: record keystreams only). */
    private static List<Observation> run(long seed, PageSealerFactory factory, Function<Slot, TenantKeyring> keyringOf) {
        SplittableRandom random = new SplittableRandom(seed);
        List<Observation> observations = new ArrayList<>();
        Slot[][] slots = new Slot[POOLS.length][RANKS];
        for (int p = 0; p < POOLS.length; p++) {
            for (int r = 0; r < RANKS; r++) {
                slots[p][r] = new Slot(POOLS[p], r);
                start(slots[p][r], factory);
            }
        }
        try {
            for (int step = 0; step < OPERATIONS; step++) {
                Slot[] ranks = slots[random.nextInt(POOLS.length)];
                int op = random.nextInt(100);
                int tenant = random.nextInt(3);
                int pick = random.nextInt(1 << 20);
                int n = 1 + random.nextInt(3);
                int plaintextSeed = random.nextInt(1000);
                for (Slot s : ranks) {
                    apply(s, op, tenant, pick, n, plaintextSeed, factory, keyringOf);
                    s.pool.endStep();
                    record(s, keyringOf.apply(s), seed, step, observations);
                }
            }
        } finally {
            for (Slot[] ranks : slots) {
                for (Slot s : ranks) {
                    s.pool.close();
                    s.memory.close();
                }
            }
        }
        return observations;
    }

    private static void start(Slot s, PageSealerFactory factory) {
        s.memory = OffHeapPageMemory.allocate(SMALL);
        s.events = new EncryptFixture.Events();
        s.pool = EncryptFixture.encryptPool(s.memory, factory, s.poolId, s.rank, s.events);
        for (String name : new String[] {"alice", "bob", "carol"}) {
            s.pool.tenants().register(name);
        }
        s.seen = 0;
        s.plaintextSeedOfPage.clear();
        s.sealedRefs.clear();
        s.owned.clear();
    }

    private static void apply(Slot s, int op, int tenant, int pick, int n, int plaintextSeed, PageSealerFactory factory,
            Function<Slot, TenantKeyring> keyringOf) {
        KvPagePool pool = s.pool;
        if (op < 45) { // allocate (reusing sealed pages once clean ones run out), write, release: seal
            long[] leases = new long[n];
            if (pool.allocate(tenant, OWNER, LeaseKind.OWNER, n, leases, 0)) {
                for (long l : leases) {
                    int page = pool.view().pageOf(l);
                    s.sealedRefs.removeIf(r -> PageHandles.page(r[1]) == page);
                    EncryptFixture.writePage(pool, tenant, OWNER, l, page, plaintextSeed);
                    s.plaintextSeedOfPage.put(page, plaintextSeed);
                }
                long[] handles = Leases.handles(pool, leases);
                pool.release(tenant, OWNER, leases, 0, n, ReleaseReason.FINISHED);
                for (long h : handles) {
                    s.sealedRefs.add(new long[] {tenant, PageHandles.sealedReference(h)});
                }
            }
        } else if (op < 70 && !s.sealedRefs.isEmpty()) { // reclaim by the owner or, sometimes, by another tenant
            long[] ref = s.sealedRefs.get(pick % s.sealedRefs.size());
            int asTenant = pick % 4 == 0 ? (int) (ref[0] + 1) % 3 : (int) ref[0];
            long[] out = new long[1];
            if (pool.reclaim(asTenant, OWNER, LeaseKind.OWNER, new long[] {ref[1]}, 0, 1, out, 0) == 1) {
                s.sealedRefs.remove(ref);
                s.owned.add(new long[] {asTenant, out[0]});
            }
        } else if (op < 80 && !s.owned.isEmpty()) { // release a reclaimed page again: sealed at its next generation
            long[] o = s.owned.remove(pick % s.owned.size());
            long handle = pool.view().handleOf(o[1]);
            pool.release((int) o[0], OWNER, new long[] {o[1]}, 0, 1, ReleaseReason.FINISHED);
            s.sealedRefs.add(new long[] {o[0], PageHandles.sealedReference(handle)});
        } else if (op < 88) { // rotate
            TenantKeyring keyring = keyringOf.apply(s);
            if (keyring != null) {
                keyring.rotate(tenant);
            }
        } else if (op < 94) { // retire every non-current epoch of a tenant
            TenantKeyring keyring = keyringOf.apply(s);
            if (keyring != null) {
                int current = keyring.currentEpoch(tenant);
                for (int e = 0; e < current; e++) {
                    keyring.retireEpoch(tenant, e);
                }
            }
        } else { // restart this rank's pool: new keyring, new boot nonce, same page ids and generations
            s.pool.close();
            s.memory.close();
            start(s, factory);
        }
    }

    /** Reads back every page sealed at this step boundary and records its keystream per buffer. */
    private static void record(Slot s, TenantKeyring keyring, long seed, int step, List<Observation> observations) {
        List<EncryptFixture.Event> all = s.events.all;
        for (; s.seen < all.size(); s.seen++) {
            EncryptFixture.Event e = all.get(s.seen);
            if (e.type() != PageEventType.SEAL) {
                continue;
            }
            String keyHex = keyring == null ? "unknown" : HexFormat.of().formatHex(TestKeys.keyBytes(keyring, e.tenant(), (int) e.detail()));
            int plaintextSeed = s.plaintextSeedOfPage.get(e.page());
            for (int b = 0; b < SMALL.bufferCount(); b++) {
                byte[] plain = EncryptFixture.plaintext(e.page(), b, plaintextSeed, (int) SMALL.pageBytes(b));
                byte[] raw = EncryptFixture.raw(s.memory, e.page(), b);
                for (int i = 0; i < raw.length; i++) {
                    raw[i] ^= plain[i];
                }
                observations.add(new Observation(keyHex, e.page(), e.generation(), b, raw, seed, step));
            }
        }
    }

    private static void verify(List<Observation> observations, long seed) {
        verifyNoRepeatedKeystream(observations, seed);
        Set<String> tuples = new HashSet<>();
        for (Observation o : observations) {
            byte[] key = HexFormat.of().parseHex(o.keyHex());
            assertArrayEquals(BouncyChaCha.keystream(key, o.page(), o.generation(), o.buffer(), 0, o.keystream().length), o.keystream(),
                    "seed " + seed + " step " + o.step() + ": keystream of page " + o.page() + " generation " + o.generation()
                            + " buffer " + o.buffer() + " is not the documented one");
            for (int counter = 0; counter * ChaCha20.BLOCK_BYTES < o.keystream().length; counter++) {
                String tuple = o.keyHex() + "/" + o.page() + "/" + o.generation() + "/" + o.buffer() + "/" + counter;
                if (!tuples.add(tuple)) {
                    fail("seed " + seed + " step " + o.step() + ": (key, nonce, counter) used twice: page " + o.page()
                            + " generation " + o.generation() + " buffer " + o.buffer() + " counter " + counter);
                }
            }
        }
    }

    private static void verifyNoRepeatedKeystream(List<Observation> observations, long seed) {
        Map<String, Observation> blocks = new HashMap<>();
        for (Observation o : observations) {
            for (int i = 0; i + ChaCha20.BLOCK_BYTES <= o.keystream().length; i += ChaCha20.BLOCK_BYTES) {
                Observation earlier = blocks.put(HexFormat.of().formatHex(o.keystream(), i, i + ChaCha20.BLOCK_BYTES), o);
                if (earlier != null) {
                    fail("seed " + seed + " step " + o.step() + ": keystream block repeated: page " + o.page() + " generation "
                            + o.generation() + " buffer " + o.buffer() + " offset " + i + " equals a block of page " + earlier.page()
                            + " generation " + earlier.generation() + " buffer " + earlier.buffer() + " (step " + earlier.step() + ")");
                }
            }
        }
    }

    /** The property is only meaningful if equal (page, generation, buffer) triples were sealed under different keys. */
    private static void assertCoincidencesHappened(List<Observation> observations, long seed) {
        Map<String, Set<String>> keysByNonce = new HashMap<>();
        for (Observation o : observations) {
            keysByNonce.computeIfAbsent(o.page() + "/" + o.generation() + "/" + o.buffer(), k -> new HashSet<>()).add(o.keyHex());
        }
        long shared = keysByNonce.values().stream().filter(keys -> keys.size() > 1).count();
        assertTrue(shared > 50, "seed " + seed + ": only " + shared + " nonces were sealed under more than one key");
        assertEquals(observations.size(), observations.stream().map(o -> o.keyHex() + o.page() + "/" + o.generation() + "/" + o.buffer())
                .distinct().count(), "seed " + seed);
    }
}
