package dev.kvshield.keys;

import static dev.kvshield.keys.EncryptFixture.SMALL;
import static dev.kvshield.keys.EncryptFixture.assertAllZero;
import static dev.kvshield.keys.EncryptFixture.assertNoPlaintextSurvives;
import static dev.kvshield.keys.EncryptFixture.assertSealedWithReferenceKeystream;
import static dev.kvshield.keys.EncryptFixture.plaintext;
import static dev.kvshield.keys.EncryptFixture.raw;
import static dev.kvshield.keys.EncryptFixture.writePage;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.audit.RetireReason;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.metrics.Rejection;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Leases;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.IntStream;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.opentest4j.AssertionFailedError;

/**
 * ENCRYPT end to end through {@link KvPagePool}: every check reads raw page bytes back from
 * memory, and each isolation oracle has a planted-bug twin that must make it fail.
 */
class EncryptPoolTest {
    private static final long REQ1 = Owners.request(1);
    private static final long REQ2 = Owners.request(2);

    @TempDir
    Path dir;

    private RootKeySource source;
    private HostPageSealerFactory factory;

    @BeforeEach
    void setUp() {
        source = RootKeySource.keyFile(TestKeys.keyFile(dir, "root.key", TestKeys.sequential(32, 0x11), "rw-------"));
        factory = new HostPageSealerFactory(source);
    }

    /** A pool, its memory, its events, and two tenants. */
    private record Setup(KvPagePool pool, PageMemory memory, EncryptFixture.Events events, int alice, int bob) implements AutoCloseable {
        @Override
        public void close() {
            pool.close();
            memory.close();
        }
    }

    private Setup setup(PageMemory memory, PageSealerFactory sealer) {
        EncryptFixture.Events events = new EncryptFixture.Events();
        KvPagePool pool = EncryptFixture.encryptPool(memory, sealer, "pool-t", 0, events);
        return new Setup(pool, memory, events, pool.tenants().register("alice"), pool.tenants().register("bob"));
    }

    /**
     * Alice allocates, writes and releases {@code n} pages, then a step seals them; returns the
     * handles (page and generation) the leases had before the release.
     */
    private static long[] sealPages(Setup s, int n, int seed) {
        long[] leases = new long[n];
        assertTrue(s.pool().allocate(s.alice(), REQ1, LeaseKind.OWNER, n, leases, 0));
        for (long l : leases) {
            writePage(s.pool(), s.alice(), REQ1, l, s.pool().view().pageOf(l), seed);
        }
        return releaseAndSeal(s, s.alice(), REQ1, leases);
    }

    /** Releases owner leases, lets a step seal their pages, and returns their handles from before the release. */
    private static long[] releaseAndSeal(Setup s, int tenant, long holder, long[] leases) {
        long[] handles = Leases.handles(s.pool(), leases);
        s.pool().release(tenant, holder, leases, 0, leases.length, ReleaseReason.FINISHED);
        s.pool().endStep();
        for (long h : handles) {
            assertEquals(PageState.SEALED, s.pool().view().stateOf(PageHandles.page(h)));
            assertEquals(tenant, s.pool().view().sealedFor(PageHandles.page(h)));
        }
        return handles;
    }

    private static void assertSealedPagesHoldNoPlaintext(Setup s, long[] handles, int seed) {
        for (long h : handles) {
            int page = PageHandles.page(h);
            for (int b = 0; b < SMALL.bufferCount(); b++) {
                byte[] plain = plaintext(page, b, seed, (int) SMALL.pageBytes(b));
                assertNoPlaintextSurvives(plain, raw(s.memory(), page, b), "page " + page + " buffer " + b);
            }
        }
    }

    @Test
    void sealedPagesHoldExactlyTheReferenceCiphertextAndNoPlaintextPattern() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] handles = sealPages(s, 3, 5);
            assertSealedPagesHoldNoPlaintext(s, handles, 5);
            TenantKeyring keyring = factory.keyring("pool-t", 0);
            List<EncryptFixture.Event> seals = s.events().of(PageEventType.SEAL);
            assertEquals(3, seals.size());
            for (EncryptFixture.Event seal : seals) {
                byte[] key = TestKeys.keyBytes(keyring, s.alice(), (int) seal.detail());
                for (int b = 0; b < SMALL.bufferCount(); b++) {
                    assertEquals(s.pool().view().generationOf(seal.page()), seal.generation());
                    assertSealedWithReferenceKeystream(plaintext(seal.page(), b, 5, (int) SMALL.pageBytes(b)),
                            raw(s.memory(), seal.page(), b), key, seal.page(), seal.generation(), b);
                }
            }
        }
    }

    @Test
    void plantedBugACipherThatSkipsTheXorFailsThePlaintextOracle() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), PlantedBugs.sealerSkippingTheXor(source))) {
            long[] handles = sealPages(s, 2, 5);
            assertThrows(AssertionFailedError.class, () -> assertSealedPagesHoldNoPlaintext(s, handles, 5));
        }
    }

    private static void handSealedPagesToBobAndCheckZero(Setup s, long[] aliceHandles) {
        int clean = s.pool().snapshot().free();
        long[] bobs = new long[clean + aliceHandles.length];
        assertTrue(s.pool().allocate(s.bob(), REQ2, LeaseKind.OWNER, bobs.length, bobs, 0));
        // Clean pages first, then sealed pages, least recently released first.
        for (int i = 0; i < aliceHandles.length; i++) {
            int page = s.pool().view().pageOf(bobs[clean + i]);
            assertEquals(PageHandles.page(aliceHandles[i]), page, "hand-out order of sealed pages");
            assertEquals(-1, s.pool().view().sealedFor(page));
            for (int b = 0; b < SMALL.bufferCount(); b++) {
                assertAllZero(raw(s.memory(), page, b), "alice's page " + page + " buffer " + b + " handed to bob");
            }
        }
    }

    @Test
    void aSealedPageHandedToAnotherTenantIsAllZero() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            handSealedPagesToBobAndCheckZero(s, sealPages(s, 2, 9));
        }
    }

    @Test
    void plantedBugAHandOutThatSkipsTheZeroingFailsTheZeroOracle() {
        try (Setup s = setup(PlantedBugs.MemorySkippingTheScrub.allocate(SMALL), factory)) {
            long[] sealed = sealPages(s, 2, 9);
            assertThrows(AssertionFailedError.class, () -> handSealedPagesToBobAndCheckZero(s, sealed));
        }
    }

    @Test
    void reclaimReturnsTheExactPlaintextAsANewOwnedHandle() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] released = sealPages(s, 2, 3);
            long[] refs = {PageHandles.sealedReference(released[0]), PageHandles.sealedReference(released[1])};
            long[] out = new long[2];
            assertEquals(2, s.pool().reclaim(s.alice(), REQ2, LeaseKind.OWNER, refs, 0, 2, out, 0));
            for (int i = 0; i < 2; i++) {
                int page = s.pool().view().pageOf(out[i]);
                assertEquals(PageHandles.page(released[i]), page);
                assertEquals(PageState.OWNED, s.pool().view().stateOf(page));
                assertEquals(REQ2, s.pool().view().holderOf(out[i]));
                for (int b = 0; b < SMALL.bufferCount(); b++) {
                    assertArrayEquals(plaintext(page, b, 3, (int) SMALL.pageBytes(b)), raw(s.memory(), page, b), "page " + page);
                }
            }
            // The reclaimed page can be released and sealed again at its next generation.
            long[] again = releaseAndSeal(s, s.alice(), REQ2, out);
            assertEquals(PageHandles.generation(released[0]) + 1, PageHandles.generation(again[0]));
            assertSealedPagesHoldNoPlaintext(s, again, 3);
        }
    }

    @Test
    void reclaimAfterReuseAnswersGoneAndYieldsNoPlaintext() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] released = sealPages(s, 1, 4);
            handSealedPagesToBobAndCheckZero(s, released);
            long[] out = {123};
            assertEquals(0, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER, new long[] {PageHandles.sealedReference(released[0])},
                    0, 1, out, 0));
            assertEquals(LeaseIds.NONE, out[0]);
            assertEquals(1.0, s.pool().metrics().reclaimCount(false));
        }
    }

    @Test
    void crossTenantAndStaleReclaimsAnswerGoneAreCountedAndLeaveThePageSealed() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] released = sealPages(s, 1, 6);
            int page = PageHandles.page(released[0]);
            long ref = PageHandles.sealedReference(released[0]);
            long[] out = new long[1];
            assertEquals(0, s.pool().reclaim(s.bob(), REQ2, LeaseKind.OWNER, new long[] {ref}, 0, 1, out, 0));
            assertEquals(LeaseIds.NONE, out[0]);
            assertEquals(1.0, s.pool().metrics().rejections(Rejection.FOREIGN));
            assertEquals(s.alice(), s.pool().view().sealedFor(page));
            long before = s.pool().stateDigest();
            assertEquals(0, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER, new long[] {released[0]}, 0, 1, out, 0),
                    "stale generation");
            assertEquals(1.0, s.pool().metrics().rejections(Rejection.STALE));
            assertEquals(before, s.pool().stateDigest(), "a refused reclaim changes nothing");
            assertEquals(PageState.SEALED, s.pool().view().stateOf(page));
            assertSealedPagesHoldNoPlaintext(s, released, 6);
            assertEquals(1, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER, new long[] {ref}, 0, 1, out, 0), "the owner still can");
            assertArrayEquals(plaintext(page, 0, 6, (int) SMALL.pageBytes(0)), raw(s.memory(), page, 0));
        }
    }

    @Test
    void rotationKeepsOldEpochsReclaimableUntilRetired() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] underEpoch0 = sealPages(s, 2, 1);
            TenantKeyring keyring = factory.keyring("pool-t", 0);
            assertEquals(1, keyring.rotate(s.alice()));
            long[] underEpoch1 = sealPages(s, 1, 2);
            List<EncryptFixture.Event> seals = s.events().of(PageEventType.SEAL);
            assertEquals(List.of(0L, 0L, 1L), seals.stream().map(EncryptFixture.Event::detail).toList());
            long[] out = new long[1];
            assertEquals(1, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER,
                    new long[] {PageHandles.sealedReference(underEpoch0[0])}, 0, 1, out, 0));
            keyring.retireEpoch(s.alice(), 0);
            assertEquals(0, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER,
                    new long[] {PageHandles.sealedReference(underEpoch0[1])}, 0, 1, out, 0));
            assertSealedPagesHoldNoPlaintext(s, new long[] {underEpoch0[1]}, 1);
            assertEquals(1, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER,
                    new long[] {PageHandles.sealedReference(underEpoch1[0])}, 0, 1, out, 0));
            int page = s.pool().view().pageOf(out[0]);
            assertArrayEquals(plaintext(page, 1, 2, (int) SMALL.pageBytes(1)), raw(s.memory(), page, 1));
        }
    }

    /**
     * The real sealer, with an operator who retires {@code epoch} of {@code tenant} right after the
     * first unseal call of a reclaim (a retirement racing the reclaim, made deterministic).
     */
    private PageSealerFactory retiringAfterFirstUnseal(int tenant, int epoch) {
        return context -> {
            PageSealer real = factory.create(context);
            TenantKeyring keyring = factory.keyring(context.poolId(), context.rank());
            return new PageSealer() {
                @Override
                public boolean canSeal(int t) {
                    return real.canSeal(t);
                }

                @Override
                public int seal(int t, int[] pages, int[] generations, int offset, int count) {
                    return real.seal(t, pages, generations, offset, count);
                }

                @Override
                public void unseal(int t, int e, int[] pages, int[] generations, int offset, int count) {
                    real.unseal(t, e, pages, generations, offset, count);
                    if (keyring.isEpochAvailable(tenant, epoch)) {
                        keyring.retireEpoch(tenant, epoch);
                    }
                }

                @Override
                public boolean isEpochAvailable(int t, int e) {
                    return real.isEpochAvailable(t, e);
                }

                @Override
                public void shred(int t) {
                    real.shred(t);
                }

                @Override
                public void close() {
                    real.close();
                }
            };
        };
    }

    /**
     * Alice's reclaim of two pages sealed under epochs 0 and 1 fails after epoch 0 was unsealed
     * (plaintext again) because epoch 1 was retired meanwhile: both pages must be out of reach at
     * once and scrubbed and retired at the next boundary.
     */
    private void reclaimAcrossARetiredEpoch(PageMemory memory) {
        int alice = 0; // registered first by setup
        try (Setup s = setup(memory, retiringAfterFirstUnseal(alice, 1))) {
            assertEquals(alice, s.alice());
            TenantKeyring keyring = factory.keyring("pool-t", 0);
            long[] underEpoch0 = sealPages(s, 1, 21);
            keyring.rotate(alice);
            long[] underEpoch1 = sealPages(s, 1, 22);
            keyring.rotate(alice);
            long[] refs = {PageHandles.sealedReference(underEpoch0[0]), PageHandles.sealedReference(underEpoch1[0])};
            long[] out = {7, 7};
            int[] touched = {PageHandles.page(underEpoch0[0]), PageHandles.page(underEpoch1[0])};
            assertThrows(ProtectionException.class, () -> s.pool().reclaim(alice, REQ1, LeaseKind.OWNER, refs, 0, 2, out, 0));
            assertArrayEquals(new long[] {7, 7}, out, "nothing was handed out");
            for (int page : touched) {
                assertEquals(PageState.QUARANTINED, s.pool().view().stateOf(page), "page " + page + " out of reach at once");
            }
            s.pool().endStep();
            for (int page : touched) {
                assertEquals(PageState.RETIRED, s.pool().view().stateOf(page));
                for (int b = 0; b < SMALL.bufferCount(); b++) {
                    assertAllZero(raw(s.memory(), page, b), "page " + page + " buffer " + b + " after the failed reclaim");
                }
            }
            List<EncryptFixture.Event> retired = s.events().of(PageEventType.RETIRE);
            assertEquals(IntStream.of(touched).sorted().boxed().toList(), retired.stream().map(EncryptFixture.Event::page).sorted().toList());
            for (EncryptFixture.Event e : retired) {
                assertEquals(RetireReason.PROTECTION_FAILED.ordinal(), (int) e.detail());
            }
            long[] everything = new long[s.pool().available()];
            assertTrue(s.pool().allocate(s.bob(), REQ2, LeaseKind.OWNER, everything.length, everything, 0));
            for (long l : everything) {
                int page = s.pool().view().pageOf(l);
                assertTrue(page != touched[0] && page != touched[1], "retired page " + page + " handed out again");
            }
        }
    }

    @Test
    void anEpochRetiredInTheMiddleOfAReclaimScrubsAndRetiresEveryTouchedPage() {
        reclaimAcrossARetiredEpoch(OffHeapPageMemory.allocate(SMALL));
    }

    @Test
    void plantedBugAScrubThatSkipsTheZeroingFailsTheFailedReclaimOracle() {
        AssertionFailedError e = assertThrows(AssertionFailedError.class,
                () -> reclaimAcrossARetiredEpoch(PlantedBugs.MemorySkippingTheScrub.allocate(SMALL)));
        assertTrue(e.getMessage().contains("after the failed reclaim"), e.getMessage());
    }

    @Test
    void cryptoShredMakesEverySealedPageUnrecoverableAndReportsEachOne() {
        try (Setup s = setup(OffHeapPageMemory.allocate(SMALL), factory)) {
            long[] first = sealPages(s, 2, 7);
            factory.keyring("pool-t", 0).rotate(s.alice());
            long[] second = sealPages(s, 1, 8);
            int shredded = s.pool().shredTenant(s.alice());
            List<EncryptFixture.Event> shreds = s.events().of(PageEventType.SHRED);
            assertEquals(3, shredded);
            assertEquals(shredded, shreds.size());
            assertEquals(java.util.stream.Stream.of(first[0], first[1], second[0]).map(PageHandles::page).sorted().toList(),
                    shreds.stream().map(EncryptFixture.Event::page).sorted().toList(), "pages reported shredded");
            for (EncryptFixture.Event e : shreds) {
                assertEquals(e.page() == PageHandles.page(second[0]) ? 1L : 0L, e.detail(), "epoch reported for page " + e.page());
                assertEquals(s.alice(), e.tenant());
            }
            long[] refs = {PageHandles.sealedReference(first[0]), PageHandles.sealedReference(first[1]),
                PageHandles.sealedReference(second[0])};
            long[] out = new long[3];
            assertEquals(0, s.pool().reclaim(s.alice(), REQ1, LeaseKind.OWNER, refs, 0, 3, out, 0));
            assertArrayEquals(new long[3], out);
            assertSealedPagesHoldNoPlaintext(s, first, 7);
            assertSealedPagesHoldNoPlaintext(s, second, 8);
            assertFalse(factory.keyring("pool-t", 0).isEpochAvailable(s.alice(), 0));
            // A shredded tenant's later releases are zeroed, never left in plaintext.
            long[] later = new long[1];
            assertTrue(s.pool().allocate(s.alice(), REQ2, LeaseKind.OWNER, 1, later, 0));
            int laterPage = s.pool().view().pageOf(later[0]);
            writePage(s.pool(), s.alice(), REQ2, later[0], laterPage, 1);
            s.pool().release(s.alice(), REQ2, later, 0, 1, ReleaseReason.FINISHED);
            s.pool().endStep();
            assertEquals(PageState.FREE, s.pool().view().stateOf(laterPage));
            assertAllZero(raw(s.memory(), laterPage, 0), "shredded tenant's released page");
        }
    }

    @Test
    void sealerRefusesMemoryThatIsNotHostAccessible() {
        try (PageMemory device = new DelegatingMemory(OffHeapPageMemory.allocate(SMALL), false)) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> EncryptFixture.encryptPool(device, factory, "pool-d", 0, new EncryptFixture.Events()));
            assertTrue(e.getMessage().contains("host-accessible") && e.getMessage().contains("device-like"), e.getMessage());
        }
    }

    @Test
    void hostAccessibleMemoryOfAnotherKindSealsThroughItsHostRegions() {
        try (Setup s = setup(new DelegatingMemory(OffHeapPageMemory.allocate(SMALL), true), factory)) {
            long[] handles = sealPages(s, 2, 11);
            assertSealedPagesHoldNoPlaintext(s, handles, 11);
            EncryptFixture.Event seal = s.events().of(PageEventType.SEAL).get(0);
            byte[] key = TestKeys.keyBytes(factory.keyring("pool-t", 0), s.alice(), 0);
            assertSealedWithReferenceKeystream(plaintext(seal.page(), 3, 11, (int) SMALL.pageBytes(3)), raw(s.memory(), seal.page(), 3),
                    key, seal.page(), seal.generation(), 3);
        }
    }

    /**
     * Promise (KvPagePool.shredTenant javadoc): "Crypto-shreds a tenant: destroys its keys through the
     * sealer and makes every page it sealed unreclaimable (each reported as a SHRED event with its
     * epoch). @return the number of sealed pages that became unrecoverable". SealedPages.shred says
     * the same ("makes every page it sealed unreclaimable (one SHRED event each, with its epoch)").
     *
     * <p>Was: a page the tenant released in the current step is already sealed (synchronous
     * quarantine: the ciphertext is in memory under the tenant's key) but still QUARANTINED until the
     * step boundary. shredTenant walks only the SEALED list, so that page is neither counted nor
     * reported: it returns 0 and emits no SHRED event; after endStep the page enters SEALED recorded
     * as reclaimable by the shredded tenant (view().sealedFor(page) == alice) with a SEAL event
     * emitted AFTER the shred. The audit trail (and the caller's count) miss a shredded page.
     */
    @Test
    void shredMissesAPageSealedInTheCurrentStep() {
        RootKeySource source = RootKeySource.keyFile(TestKeys.keyFile(dir, "root.key", TestKeys.sequential(32, 0x22), "rw-------"));
        HostPageSealerFactory factory = new HostPageSealerFactory(source);
        EncryptFixture.Events events = new EncryptFixture.Events();
        try (PageMemory memory = OffHeapPageMemory.allocate(EncryptFixture.SMALL);
                KvPagePool pool = EncryptFixture.encryptPool(memory, factory, "pool-s", 0, events)) {
            int alice = pool.tenants().register("alice");
            long owner = Owners.request(1);
            long[] lease = new long[1];
            assertTrue(pool.allocate(alice, owner, LeaseKind.OWNER, 1, lease, 0));
            int page = pool.view().pageOf(lease[0]);
            EncryptFixture.writePage(pool, alice, owner, lease[0], page, 5);
            pool.release(alice, owner, lease, 0, 1, ReleaseReason.FINISHED);
            assertTrue(events.of(PageEventType.PROTECT_ISSUED).stream().anyMatch(e -> e.page() == page)
                    && events.of(PageEventType.SEAL).isEmpty(), "precondition: the page's seal was issued in this step, not yet collected");

            int shredded = pool.shredTenant(alice);
            pool.endStep();

            assertEquals(PageState.SEALED, pool.view().stateOf(page));
            assertEquals(-1, pool.view().sealedFor(page),
                    "after the shred the page is still recorded as reclaimable by the shredded tenant");
            assertEquals(1, events.of(PageEventType.SHRED).size(), "no SHRED event for a page alice sealed before the shred");
            assertEquals(1, shredded, "shredTenant did not count the page alice sealed in this step");
        }
    }
}
