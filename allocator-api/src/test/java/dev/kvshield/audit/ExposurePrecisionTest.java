package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.Leases;
import dev.kvshield.testing.TestPools;
import dev.kvshield.testing.TestXorSealer;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The precision of {@code audit exposure} over a trail without reads (the bridge's), both ways, against ground truth
 * read from the bytes: the engine writes each slot it was given as a tag naming its tenant and request, and at every
 * hand-out the test reads the page back before the new owner writes, counting the slots that hold another tenant's
 * tag. The query must name exactly the requests that received such slots, with the same tenants and counts: not a
 * request handed zeros, ciphertext cleared at hand-out, or its own tenant's bytes.
 */
class ExposurePrecisionTest {
    private static final long TAG = 0xC0DE_0000_0000_0000L;

    @TempDir
    Path dir;

    /** What a hand-out put in front of its request, by the bytes: the foreign tenants and how many slots of theirs. */
    private record Truth(TreeSet<String> sources, long slots) {}

    /** A pool of {@code pages} (page 0 reserved) at {@code level}, its trail without reads, and the bytes' ground truth. */
    private final class World implements AutoCloseable {
        final TestPools t;
        final AuditTrail trail;
        final Arena arena = Arena.ofConfined();
        final Map<String, Truth> truth = new TreeMap<>();
        /** What each page handed out held from other tenants, in hand-out order. */
        final List<Truth> seen = new java.util.ArrayList<>();
        final Path where;

        World(String name, int pages, ProtectionLevel level, UnaryOperator<PageMemory> wrapMemory) throws IOException {
            this(name, pages, level, wrapMemory, null);
        }

        /** A world whose trail also ships its checkpoints to {@code shipped} (null: none). */
        World(String name, int pages, ProtectionLevel level, UnaryOperator<PageMemory> wrapMemory, Path shipped) throws IOException {
            UnaryOperator<dev.kvshield.pool.PoolConfig.Builder> cfg = level == ProtectionLevel.ENCRYPT
                    ? b -> b.sealer((PageSealerFactory) ctx -> new TestXorSealer(ctx.memory())) : UnaryOperator.identity();
            t = TestPools.bare(TestPools.tinyGeometry(pages), level, cfg, wrapMemory);
            where = dir.resolve(name);
            if (!java.nio.file.Files.exists(dir.resolve(AuditKeys.PUBLIC_FILE))) {
                AuditKeys.generate(dir);
            }
            AuditConfig.Builder config = AuditFixtures.config(where, AuditKeys.loadSigningKey(dir.resolve(AuditKeys.PRIVATE_FILE)),
                    1 << 20).readsRecorded(false);
            trail = AuditTrail.attach(t.pool, (shipped == null ? config : config.shipper(CheckpointShipper.appendingTo(shipped))).build());
        }

        int tenant(String name) {
            return t.pool.tenants().register(name);
        }

        /** A hand-out as the bridge makes it (recorded written up to {@code written} slots of its last page), then the engine's writes. */
        long[] serve(int tenant, long request, int pages, int written) {
            long[] leases = new long[pages];
            assertTrue(t.pool.allocateRowsWritten(1, new int[] {tenant}, new long[] {Owners.request(request)}, new int[] {pages},
                    new int[] {written}, LeaseKind.OWNER, leases, 0));
            for (int i = 0; i < pages; i++) {
                int page = t.pool.view().pageOf(leases[i]);
                see(tenant, request, page);
                write(tenant, request, page, i < pages - 1 ? 4 : written);
            }
            return leases;
        }

        /** Reclaims a sealed page for a prefix hit of the tenant that sealed it. */
        long reclaim(int tenant, long request, long releasedHandle) {
            long[] out = new long[1];
            assertEquals(1, t.pool.reclaim(tenant, Owners.request(request), LeaseKind.OWNER,
                    new long[] {PageHandles.sealedReference(releasedHandle)}, 0, 1, out, 0));
            see(tenant, request, t.pool.view().pageOf(out[0]));
            return out[0];
        }

        void finish(int tenant, long request, long[] leases) {
            t.pool.release(tenant, Owners.request(request), leases, 0, leases.length, ReleaseReason.FINISHED);
            trail.requestFinished(tenant, request, RequestOutcome.COMPLETED);
            t.pool.endStep();
        }

        /** The ground truth of one hand-out: every slot whose bytes (any buffer) carry another tenant's tag. */
        private void see(int tenant, long request, int page) {
            seen.add(new Truth(new TreeSet<>(), 0));
            MemorySegment word = arena.allocate(AuditFixtures.TOKEN_BYTES);
            for (int s = 0; s < 4; s++) {
                String source = null;
                for (int b = 0; b < t.pool.geometry().bufferCount(); b++) {
                    t.memory.read(page, b, s, word);
                    long v = word.get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
                    int writer = (int) ((v >>> 32) & 0xFFFF);
                    if ((v & 0xFFFF_0000_0000_0000L) == TAG && writer != tenant) {
                        source = t.pool.tenants().name(writer);
                    }
                }
                if (source != null) {
                    Truth page1 = seen.getLast();
                    page1.sources().add(source);
                    seen.set(seen.size() - 1, new Truth(page1.sources(), page1.slots() + 1));
                    String key = t.pool.tenants().name(tenant) + "/" + request;
                    Truth old = truth.getOrDefault(key, new Truth(new TreeSet<>(), 0));
                    old.sources().add(source);
                    truth.put(key, new Truth(old.sources(), old.slots() + 1));
                }
            }
        }

        private void write(int tenant, long request, int page, int slots) {
            MemorySegment word = arena.allocate(AuditFixtures.TOKEN_BYTES);
            word.set(ValueLayout.JAVA_LONG_UNALIGNED, 0, TAG | (long) tenant << 32 | request);
            for (int s = 0; s < slots; s++) {
                for (int b = 0; b < t.pool.geometry().bufferCount(); b++) {
                    t.memory.write(page, b, s, word);
                }
            }
        }

        /** What {@code audit exposure} names over the closed trail, in the ground truth's terms. */
        Map<String, Truth> named() throws IOException {
            return named(Long.MIN_VALUE, Long.MAX_VALUE);
        }

        /** As {@link #named()}, for hand-outs recorded in {@code [from, to]}. */
        Map<String, Truth> named(long from, long to) throws IOException {
            trail.close();
            Map<String, Truth> m = new TreeMap<>();
            for (ExposureQuery.Exposure e : ExposureQuery.run(AuditLog.read(List.of(where)), from, to).exposed()) {
                m.put(e.tenant() + "/" + e.request(), new Truth(new TreeSet<>(e.sourceTenants()), e.foreignSlotsReceived()));
            }
            return m;
        }

        @Override
        public void close() {
            arena.close();
            t.close();
        }
    }

    private static Truth from(long slots, String... sources) {
        return new Truth(new TreeSet<>(List.of(sources)), slots);
    }

    /**
     * ENCRYPT: alice's page is sealed at release; bob's request is handed it next, and the pool zeroes a sealed page it
     * hands to anyone (the bytes bob's request finds are zero). The query named bob's request as having received 4 of
     * alice's unscrubbed slots: the tracker cleared a page's writers only on a protection that scrubs, and a seal does
     * not scrub. Alice's own reclaim of her sealed page is no exposure either, nor is the same page re-sealed and
     * handed to bob after it.
     */
    @Test
    void aSealedPageHandedToAnotherTenantIsZeroedAndNamesNobody() throws IOException {
        try (World w = new World("encrypt", 2, ProtectionLevel.ENCRYPT, UnaryOperator.identity())) {
            int alice = w.tenant("alice");
            int bob = w.tenant("bob");
            long[] first = w.serve(alice, 1, 1, 4);
            long handle = Leases.handles(w.t.pool, first)[0];
            w.finish(alice, 1, first);
            long reclaimed = w.reclaim(alice, 2, handle);
            w.write(alice, 2, w.t.pool.view().pageOf(reclaimed), 4);
            w.finish(alice, 2, new long[] {reclaimed});
            w.finish(bob, 3, w.serve(bob, 3, 1, 4));
            w.finish(alice, 4, w.serve(alice, 4, 1, 2));
            assertEquals(Map.of(), w.truth, "the bytes: every hand-out of another tenant's sealed page was zeroed");
            assertEquals(w.truth, w.named());
        }
    }

    /**
     * A reclaim hands out what the seal held: xavier (level NONE) leaves his page unscrubbed; alice's request 2 is handed
     * it (named: 4 of xavier's slots), writes 2 slots and releases; the page is sealed whole, so alice's request 3,
     * reclaiming it for a prefix hit, gets xavier's other 2 slots back with hers. The query judged hand-outs only and
     * did not name request 3; a reclaim in a trail without reads is now judged as the hand-out it is.
     */
    @Test
    void aReclaimReturningAnotherTenantsLeftoversNamesTheReclaimer() throws IOException {
        try (World w = new World("reclaim", 2, ProtectionLevel.ENCRYPT, UnaryOperator.identity())) {
            int xavier = w.t.pool.tenants().register("xavier", dev.kvshield.tenant.TenantPolicy.withLevel(ProtectionLevel.NONE));
            int alice = w.tenant("alice");
            w.finish(xavier, 1, w.serve(xavier, 1, 1, 4));
            long[] second = w.serve(alice, 2, 1, 2);
            long handle = Leases.handles(w.t.pool, second)[0];
            w.finish(alice, 2, second);
            w.finish(alice, 3, new long[] {w.reclaim(alice, 3, handle)});
            assertEquals(Map.of("alice/2", from(4, "xavier"), "alice/3", from(2, "xavier")), w.truth);
            assertEquals(w.truth, w.named());
        }
    }

    /**
     * NONE: what each hand-out received is named with its true tenants and slot counts, whatever the writes in between
     * covered: carol's request gets a page bob wrote 1 slot of over alice's 4 (1 of bob's, 3 of alice's); alice's next
     * request gets bob's 1 slot only (her own 3 are no exposure); dave's request on a page only alice wrote is named
     * with alice alone.
     */
    @Test
    void atNoneEachHandOutIsNamedWithTheTenantsAndSlotsItsBytesHold() throws IOException {
        try (World w = new World("none", 2, ProtectionLevel.NONE, UnaryOperator.identity())) {
            int alice = w.tenant("alice");
            int bob = w.tenant("bob");
            int carol = w.tenant("carol");
            w.finish(alice, 1, w.serve(alice, 1, 1, 4));
            w.finish(alice, 2, w.serve(alice, 2, 1, 4));
            w.finish(bob, 3, w.serve(bob, 3, 1, 1));
            w.finish(carol, 4, w.serve(carol, 4, 1, 0));
            w.finish(alice, 5, w.serve(alice, 5, 1, 0));
            assertEquals(Map.of("bob/3", from(4, "alice"), "carol/4", from(4, "alice", "bob"), "alice/5", from(1, "bob")), w.truth);
            assertEquals(w.truth, w.named());
        }
    }

    /**
     * A window names what was received in it: dave's request is handed one tenant's page, then (later) the other's; a
     * query from the second hand-out on named it with both tenants and 8 slots, the whole request's count, although
     * the first tenant's slots reached it before the window (an operator notifying the tenants whose data leaked in
     * the window would have told that one too). It now names the second tenant and its 4 slots; the whole trail still
     * names both.
     */
    @Test
    void aWindowCountsOnlyWhatWasReceivedInIt() throws IOException, InterruptedException {
        try (World w = new World("window", 3, ProtectionLevel.NONE, UnaryOperator.identity())) {
            int alice = w.tenant("alice");
            int carol = w.tenant("carol");
            int dave = w.tenant("dave");
            long[] a = w.serve(alice, 1, 1, 4);
            long[] c = w.serve(carol, 2, 1, 4);
            w.finish(alice, 1, a);
            w.finish(carol, 2, c);
            long[] first = w.serve(dave, 3, 1, 4);
            w.t.pool.endStep();
            Thread.sleep(5);
            long[] second = w.serve(dave, 3, 1, 4);
            w.finish(dave, 3, new long[] {first[0], second[0]});
            Truth before = w.seen.get(2);
            Truth inWindow = w.seen.get(3);
            assertEquals(4, before.slots());
            assertEquals(4, inWindow.slots());
            assertNotEquals(before.sources(), inWindow.sources());
            w.trail.close();
            long secondAt = AuditLog.read(List.of(w.where)).stream().filter(l -> l.isRecord() && l.type().equals("allocate"))
                    .mapToLong(l -> l.number("wall", 0)).max().orElseThrow();
            assertEquals(Map.of("dave/3", inWindow), w.named(secondAt, Long.MAX_VALUE));
            assertEquals(w.truth, w.named());
        }
    }

    /**
     * Who an exposure names: a cache namespace handed another tenant's unscrubbed page was named as the request with
     * the namespace's number (an innocent request 2 of bob's would be named), and the engine's unattributed holdings
     * as request 2^62 - 1, which no request is (the trail names a request, namespace or neither apart). Now each is named as what it is, as a blocked attempt's holder is.
     */
    @Test
    void anExposedNamespaceOrUnattributedHoldingIsNotNamedAsARequest() throws IOException {
        try (World w = new World("holders", 4, ProtectionLevel.NONE, UnaryOperator.identity())) {
            int alice = w.tenant("alice");
            int bob = w.tenant("bob");
            w.finish(alice, 1, w.serve(alice, 1, 3, 4));
            long[] ns = new long[1];
            long[] engine = new long[1];
            assertTrue(w.t.pool.allocate(bob, Owners.namespace(2), LeaseKind.NAMESPACE, 1, ns, 0));
            assertTrue(w.t.pool.allocate(bob, Owners.UNATTRIBUTED, LeaseKind.OWNER, 1, engine, 0));
            w.trail.close();
            List<String> named = ExposureQuery.run(AuditLog.read(List.of(w.where)), Long.MIN_VALUE, Long.MAX_VALUE).exposed().stream()
                    .map(ExposureQuery.Exposure::who).sorted().toList();
            assertEquals(List.of("tenant bob namespace 2", "tenant bob unattributed"), named);
        }
    }

    /**
     * The planted twin of the byte oracle: a ZERO pool whose scrub does nothing (a protection bug the pool cannot see
     * at this level) hands alice's bytes to bob; the bytes say so, so the oracle above can fail.
     */
    @Test
    void twinABrokenScrubLeavesAliceBytesTheOracleSees() throws IOException {
        UnaryOperator<PageMemory> noScrub = m -> new dev.kvshield.memory.ForwardingPageMemory(m) {
            @Override
            public void scrub(int[] pages, int offset, int count) { }
        };
        try (World w = new World("twin", 2, ProtectionLevel.ZERO, noScrub)) {
            int alice = w.tenant("alice");
            int bob = w.tenant("bob");
            w.finish(alice, 1, w.serve(alice, 1, 1, 4));
            w.finish(bob, 2, w.serve(bob, 2, 1, 4));
            assertEquals(Map.of("bob/2", from(4, "alice")), w.truth);
            assertNotEquals(w.truth, w.named(), "a ZERO trail trusts its scrub: the oracle tells them apart");
        }
    }

    private record Tool(int status, String out, String err) {}

    private static Tool tool(String... args) {
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        java.io.ByteArrayOutputStream err = new java.io.ByteArrayOutputStream();
        int status = AuditTool.run(args, new java.io.PrintStream(out, true, java.nio.charset.StandardCharsets.UTF_8),
                new java.io.PrintStream(err, true, java.nio.charset.StandardCharsets.UTF_8));
        return new Tool(status, out.toString(java.nio.charset.StandardCharsets.UTF_8), err.toString(java.nio.charset.StandardCharsets.UTF_8));
    }

    /** The requests {@code exposure --json} names, as {@code tenant/request}. */
    @SuppressWarnings("unchecked")
    private static List<String> namedBy(Tool t) {
        Map<String, Object> doc = dev.kvshield.audit.internal.Json.parseObject(t.out().strip());
        return ((List<Map<String, Object>>) doc.get("exposed")).stream().map(e -> e.get("tenant") + "/" + e.get("request")).toList();
    }

    /**
     * A record edited after the fact (bob's hand-out re-attributed to alice): {@code verify} fails the trail, and
     * {@code exposure} answered from the edited record alone, naming nobody, exit 0, with no word that the trail it read
     * was never checked. It now checks each trail it reads with the pinned key when given one and says, per trail and
     * in its verdict, whether the answer stands on a verified trail; a trail that fails is named and the exit status is
     * verify's; without a key the answer says it is unverified. A trail cut mid-record is reported the same way.
     */
    /**
     * A boot's trail deleted (or left out) while the shipped checkpoints name it: the answer misses what that boot
     * recorded, so it is not verified, naming the trail. Both boots given, it is.
     */
    @Test
    void exposureSaysWhenATrailTheShippedCheckpointsNameIsMissing() throws IOException {
        Path shipped = dir.resolve("shipped.jsonl");
        for (int boot = 1; boot <= 2; boot++) { // NOTE: one pool and rank, two boots
            try (World w = new World("boot" + boot, 2, ProtectionLevel.NONE, UnaryOperator.identity(), shipped)) {
                int alice = w.tenant("alice");
                int bob = w.tenant("bob");
                w.finish(alice, boot, w.serve(alice, boot, 1, 4));
                w.finish(bob, 10 + boot, w.serve(bob, 10 + boot, 1, 4));
                w.trail.close(); // NOTE: its final checkpoint shipped before the next boot opens
            }
        }
        String pub = dir.resolve(AuditKeys.PUBLIC_FILE).toString();
        String first = dir.resolve("boot1").toString();
        String second = dir.resolve("boot2").toString();
        Tool both = tool("exposure", "--json", "--pubkey", pub, "--shipped", shipped.toString(), first, second);
        assertEquals(0, both.status(), both.out() + both.err());
        assertEquals(List.of("bob/11", "bob/12"), namedBy(both));

        String firstTrail = String.valueOf(dev.kvshield.audit.internal.Json.parseObject(
                java.nio.file.Files.readAllLines(shipped).getFirst()).get("trail"));
        Tool missing = tool("exposure", "--json", "--pubkey", pub, "--shipped", shipped.toString(), second);
        assertEquals(2, missing.status(), "the answer misses a whole boot");
        assertEquals(List.of("bob/12"), namedBy(missing), "what the boot given says");
        assertTrue(missing.out().contains("\"verified\":false"), missing.out());
        assertTrue(missing.out().contains("trail " + firstTrail + " of pool") && missing.out().contains("none of the paths given holds"),
                missing.out());
        Tool text = tool("exposure", "--pubkey", pub, "--shipped", shipped.toString(), second);
        assertTrue(text.out().startsWith("NOT VERIFIED"), text.out());
    }

    @Test
    void exposureOverAnEditedTrailSaysItIsNotVerified() throws IOException {
        Path trail;
        int alice;
        int bob;
        try (World w = new World("edited", 2, ProtectionLevel.NONE, UnaryOperator.identity())) {
            alice = w.tenant("alice");
            bob = w.tenant("bob");
            w.finish(alice, 1, w.serve(alice, 1, 1, 4));
            w.finish(bob, 2, w.serve(bob, 2, 1, 4));
            assertEquals(Map.of("bob/2", from(4, "alice")), w.truth);
            assertEquals(w.truth, w.named());
            trail = w.where;
        }
        String pub = dir.resolve(AuditKeys.PUBLIC_FILE).toString();
        Tool clean = tool("exposure", "--json", "--pubkey", pub, trail.toString());
        assertEquals(0, clean.status(), clean.err());
        assertEquals(List.of("bob/2"), namedBy(clean));
        assertTrue(clean.out().contains("\"verified\":true"), clean.out());

        Path file = AuditLog.files(List.of(trail)).getFirst();
        List<String> lines = new java.util.ArrayList<>(java.nio.file.Files.readAllLines(file));
        int edited = 0;
        for (int i = 0; i < lines.size(); i++) {
            String l = lines.get(i);
            if (l.contains("\"type\":\"allocate\"") && l.contains("\"tenant\":" + bob + ",")) {
                lines.set(i, l.replace("\"tenant\":" + bob + ",", "\"tenant\":" + alice + ","));
                edited++;
            }
        }
        assertEquals(1, edited);
        java.nio.file.Files.write(file, lines);
        assertEquals(2, tool("verify", "--pubkey", pub, trail.toString()).status());

        Tool checked = tool("exposure", "--json", "--pubkey", pub, trail.toString());
        assertEquals(2, checked.status(), "the answer stands on a trail that failed verification");
        assertEquals(List.of(), namedBy(checked), "what the edited records say");
        assertTrue(checked.out().contains("\"verified\":false"), checked.out());
        assertTrue(checked.out().contains("\"firstBadSeq\":"), checked.out());
        Tool text = tool("exposure", "--pubkey", pub, trail.toString());
        assertTrue(text.out().startsWith("NOT VERIFIED"), text.out());

        java.nio.file.Files.write(file, lines.subList(0, lines.size() - 1));
        java.nio.file.Files.writeString(file, lines.getLast().substring(0, lines.getLast().length() / 2),
                java.nio.file.StandardOpenOption.APPEND);
        Tool cut = tool("exposure", "--json", "--pubkey", pub, trail.toString());
        assertEquals(2, cut.status(), "a trail cut mid-record");
        assertTrue(cut.out().contains("\"verified\":false") && cut.err().contains("not verified"), cut.out() + cut.err());

        Tool unchecked = tool("exposure", "--json", trail.toString());
        assertTrue(unchecked.out().contains("\"verified\":false"), unchecked.out());
        assertTrue(unchecked.err().contains("not verified"), unchecked.err());
        assertTrue(tool("exposure", trail.toString()).out().startsWith("NOT VERIFIED"));
    }
}
