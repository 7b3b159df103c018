package dev.kvshield.perf.fuzz;

import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.extent.ReadBeforeWriteException;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffOutcome;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.lease.FencedLeaseException;
import dev.kvshield.lease.LeaseCapacityException;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseIdsExhaustedException;
import dev.kvshield.lease.LeaseKind;
import dev.kvshield.lease.ReleasedLeaseException;
import dev.kvshield.lease.StaleLeaseException;
import dev.kvshield.lifecycle.PageState;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.fuzz.FuzzTrace.Event;
import dev.kvshield.perf.fuzz.FuzzTrace.Kind;
import dev.kvshield.perf.fuzz.FuzzTrace.RequestSpec;
import dev.kvshield.perf.simulate.Canary;
import dev.kvshield.perf.simulate.LeakOracle;
import dev.kvshield.perf.simulate.ResidueOracle;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.pool.PoolSnapshot;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionException;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Replays a {@link FuzzTrace} on one thread over a fresh pool: each request is a logical actor
 * whose {@code adv} events walk it through its life (local: allocate, write page by page, read
 * back, finish; handoff: prefill pages, begin the transfer and reserve decode pages, land each
 * page as a DMA engine would (raw bytes, then the claim's written record), commit on the published
 * coverage, read back, finish), while cancellations, "done" signals, claim timers, prefix
 * evictions, step boundaries and the protection worker fire where the schedule puts them.
 *
 * <p>Every read-back is compared with the request's own canary (a mismatch is {@code LEAK} when a
 * byte names another writer, else {@code CORRUPT}); every page handed out is checked by the
 * {@link ResidueOracle}; a cancelled request's late write must be refused. Every lease the pool
 * mints is tracked in a {@link LeaseModel}, and {@link LeaseOracles} check ids, holds (after every
 * event), hostile batches (duplicate, foreign, released, never-minted, colliding and wrong-kind ids
 * in every batch call, unmatches of readers not held), all-or-nothing refusals (hostile batches,
 * and calls refused because the ids ran out, in pools started near the counter's end), and pages
 * whose protection failed (armed backend faults at any position of a batch; reclaims whose second
 * key epoch an operator retires after the first was unsealed). After the schedule the trace drains
 * (every transfer acknowledged, every page released, step boundaries run): the pool must own and
 * quarantine nothing, every page whose protection failed must be retired and zero, and every free
 * page must be zero.
 *
 * <p>Not thread-safe; one runner per thread (the pool's own protection worker may run beside it).
 */
public final class TraceRunner {
    static final long PREFILL_PEER = 11;
    static final long DECODE_PEER = 12;
    /** Canary request id of prefix {@code p} of tenant {@code t}: {@code PREFIX_WRITER_BASE + t * 8 + p}. */
    static final long PREFIX_WRITER_BASE = 1_000_000;
    private static final int BYTES_PER_TOKEN = 16;
    /** Step boundaries the drain may run before a pool that still quarantines pages counts as not recovered. */
    private static final int DRAIN_STEPS = 16;

    private final PageSealerFactory sealer;

    /** @param sealer the ENCRYPT key source, or {@code null} (traces at ENCRYPT then cannot run) */
    public TraceRunner(PageSealerFactory sealer) {
        this.sealer = sealer;
    }

    public boolean supports(ProtectionLevel level) {
        return !level.needsKeySource() || sealer != null;
    }

    /** Whether a level hands pages to a new holder with the old bytes gone (zeroed, or sealed then cleared); NONE does not. */
    static boolean protectsBytes(ProtectionLevel level) {
        return level.scrubsOnRelease() || level.needsKeySource();
    }

    /** The geometry of every fuzz pool: one layer of K and V, one 16-byte canary cell per token, 4-token pages. */
    public static PoolGeometry geometry(int pages) {
        return PoolGeometry.builder().mha(1, 1, 8, 2).pageSizeTokens(FuzzTrace.PAGE_TOKENS).pageCount(pages).build();
    }

    public RunResult run(FuzzTrace trace, Rig rig) {
        if (!supports(trace.config().level())) {
            throw new IllegalArgumentException("level ENCRYPT needs a key source and this runner has none");
        }
        try (Run run = new Run(trace, rig)) {
            return run.execute();
        }
    }

    /** Thrown inside a run to stop it at an unexpected exception (already recorded as a finding). */
    private static final class Abort extends RuntimeException {
        Abort() {
            super(null, null, false, false);
        }
    }

    private enum Phase {
        ALLOC,
        WRITE,
        BEGIN,
        TRANSFER,
        COMMIT,
        READ,
        FINISH,
        DONE
    }

    private static final class Actor {
        final RequestSpec spec;
        final long owner;
        Phase phase = Phase.ALLOC;
        /** The request's owner leases on its (local or prefill) pages. */
        long[] pages;
        boolean pagesHeld;
        int next;
        /** The request's reader lease on its prefix page ({@link LeaseIds#NONE} before it matched). */
        long prefixReader = LeaseIds.NONE;
        /** The request ended its read of its prefix early ({@code unmatch}). */
        boolean unmatched;
        /** Pages written so far, from the first. */
        int written;
        boolean cancelled;
        boolean zombieTried;
        HandoffSender.Transfer transfer;
        /** The sender's reader claims on the source pages, as the model knows them. */
        long[] sendClaims;
        Reservation reservation;
        /** The reservation's leases as the model knows them: reservations, then owner leases once committed. */
        long[] resLeases;
        boolean resReleased;
        boolean resClaimsEnded;
        boolean transportDone;
        /** The receiver decided (committed, refused, aborted, expired): the transport's "done" may now drop its claims. */
        boolean decided;
        boolean acknowledged;
        boolean expired;
        boolean committed;
        boolean finished;

        Actor(RequestSpec spec) {
            this.spec = spec;
            this.owner = Owners.request(spec.id());
        }
    }

    private static final class Prefix {
        final int tenant;
        final int id;
        /** The tenant's cache namespace's lease on the prefix page. */
        long lease;
        long sealedRef;

        Prefix(int tenant, int id) {
            this.tenant = tenant;
            this.id = id;
        }

        long writer() {
            return PREFIX_WRITER_BASE + tenant * 8L + id;
        }
    }

    /** A page a local request wrote and released under a sealing level: its sealed reference and what it holds. */
    private record SealedPage(long ref, long writer, int firstPosition, int tokens) {}

    /** Sealed request pages a trace keeps per tenant for batch reclaims. */
    private static final int SEALED_PAGES_KEPT = 6;

    private final class Run implements AutoCloseable, Misuse.Ids {
        final FuzzTrace trace;
        final Rig rig;
        final PoolGeometry geometry;
        final OffHeapPageMemory base;
        final KvPagePool pool;
        final PageMemory memory;
        final Faults faults = new Faults();
        /** The key operator of a sealing pool, or null. */
        RacingSealer operator;
        final long firstSerial;
        final LeaseOracles oracles;
        /** Releases made through {@link #release}: every other one goes by pages. */
        private long releases;
        final HandoffSender sender;
        final HandoffReceiver receiver;
        final ResidueOracle residue;
        final LeakOracle leaks = new LeakOracle();
        final Arena arena = Arena.ofConfined();
        final MemorySegment data;
        final MemorySegment expected;
        final Map<Integer, Actor> actors = new TreeMap<>();
        /** Resident prefixes in residence order (the eviction order), keyed tenant * 8 + id. */
        final Map<Integer, Prefix> resident = new LinkedHashMap<>();
        final Map<Integer, Prefix> sealedPrefixes = new LinkedHashMap<>();
        /** Per tenant, the sealed references of pages its finished local requests wrote (the latest few). */
        final Map<Integer, List<SealedPage>> sealedPages = new TreeMap<>();
        final List<Finding> findings = new ArrayList<>();
        final Map<Integer, Long> readBack = new TreeMap<>();
        /** Another pool of the same geometry and first serial, built on the first id it is asked for. */
        OffHeapPageMemory otherMemory;
        KvPagePool other;
        long[] otherIds;
        int eventIndex;
        int rejections;
        int protectionErrors;

        Run(FuzzTrace trace, Rig rig) {
            this.trace = trace;
            this.rig = rig;
            FuzzTrace.Config c = trace.config();
            geometry = geometry(c.pages());
            base = OffHeapPageMemory.allocate(geometry);
            memory = rig.memory(faults.memory(base));
            LeaseIds ids = new LeaseIds(c.pages());
            firstSerial = c.serials() < 0 ? 1 : ids.maxSerial() - c.serials() + 1;
            PoolConfig.Builder config = config(c);
            if (sealer != null) {
                config.sealer(ctx -> operator = new RacingSealer(sealer.create(ctx), faults));
            }
            pool = KvPagePool.create(config.build(), memory);
            // A stand-in for the audit trail COMPLIANCE hands out pages under (the trail's own tests live in allocator-api).
            pool.attachAuditTrail((type, page, generation, tenant, holder, detail) -> { });
            for (int t = 0; t < c.tenants(); t++) {
                pool.tenants().register("tenant-" + t);
            }
            sender = new HandoffSender(pool);
            receiver = new HandoffReceiver(pool, alarm -> { });
            sender.handshake(DECODE_PEER, receiver.effectiveLimitTokens());
            receiver.handshake(PREFILL_PEER, sender.effectiveLimitTokens());
            residue = new ResidueOracle(base);
            data = arena.allocate((long) FuzzTrace.PAGE_TOKENS * BYTES_PER_TOKEN, 16);
            expected = arena.allocate((long) FuzzTrace.PAGE_TOKENS * BYTES_PER_TOKEN, 16);
            oracles = new LeaseOracles(pool, new LeaseModel(ids, c.pages(), firstSerial), rig, residue, this::fail,
                    () -> slice(data, 1));
            pool.addListener((type, page, generation, tenant, holder, detail) -> {
                if (type == PageEventType.PROTECT_FAILED) {
                    oracles.protectionFailed(page);
                }
            });
            for (RequestSpec r : trace.requests()) {
                actors.put(r.id(), new Actor(r));
            }
        }

        /** The pool's configuration (also the other pool's, at NONE). */
        PoolConfig.Builder config(FuzzTrace.Config c) {
            PoolConfig.Builder config = PoolConfig.builder(geometry).level(c.level()).quarantineMode(c.mode())
                    .releaseLagSteps(c.lagSteps()).poolId("fuzz").testingFirstLeaseSerial(firstSerial)
                    .admission(new AdmissionPolicy(geometry.capacityTokens(), 0, false));
            if (c.generations() > 0) {
                config.testingInitialGeneration(PageHandles.MAX_GENERATION - c.generations());
            }
            if (c.claims() > 0) {
                config.maxClaims(c.claims());
            }
            return config;
        }

        RunResult execute() {
            List<Event> events = trace.events();
            try {
                for (eventIndex = 0; eventIndex < events.size(); eventIndex++) {
                    apply(events.get(eventIndex));
                    oracles.checkHolds();
                }
                eventIndex = -1;
                drain();
            } catch (Abort stopped) {
                // Recorded as a finding where it was thrown.
            }
            long failures = (long) (pool.metrics().protectionFailureCount() + pool.metrics().verifyFailureCount());
            return new RunResult(List.copyOf(findings), Map.copyOf(readBack), events.size(), rejections, protectionErrors, failures,
                    oracles.refusals(), oracles.exhaustions());
        }

        void apply(Event e) {
            try {
                switch (e.action()) {
                    case ADV -> advance(actors.get(e.target()));
                    case CANCEL -> cancel(actors.get(e.target()));
                    case ACK -> acknowledge(actors.get(e.target()));
                    case EXPIRE -> expire(actors.get(e.target()));
                    case EVICT -> evict(e.target());
                    case STEP -> endStep();
                    case PROTECT -> rig.protectionStep();
                    case MISUSE -> misuse(actors.get(e.target()), Misuse.decode(e.arg()));
                    case UNMATCH -> unmatch(actors.get(e.target()));
                    case CHURN -> churn(actors.get(e.target()), e.arg());
                    case RACE -> {
                        if (operator != null) {
                            operator.race(e.target(), e.arg() % 2);
                        }
                    }
                    case RECLAIM -> {
                        if (operator != null && e.arg() / 3 % 2 == 1) {
                            operator.race(e.target(), e.arg() / 6 % 2);
                        }
                        reclaimSealed(e.target(), e.arg() % 3);
                    }
                    case FAULT -> faults.arm(e.arg());
                }
            } catch (Abort a) {
                throw a;
            } catch (RuntimeException | Error x) {
                throw unexpected(e.action().targetsRequest() ? e.target() : -1, "event '" + e + "' threw " + x);
            }
        }

        Abort unexpected(int request, String message) {
            return fail(Finding.Kind.INVARIANT, request, message);
        }

        Abort fail(Finding.Kind kind, int request, String message) {
            findings.add(new Finding(kind, eventIndex, request, message));
            return new Abort();
        }

        void endStep() {
            try {
                pool.endStep();
            } catch (ProtectionException x) {
                protectionErrors++;
            }
            oracles.checkFailedPages();
        }

        // ------------------------------------------------------------ Misuse.Ids

        @Override
        public LeaseModel model() {
            return oracles.model();
        }

        @Override
        public long[] otherPool() {
            if (other == null) {
                otherMemory = OffHeapPageMemory.allocate(geometry);
                other = KvPagePool.create(config(new FuzzTrace.Config(ProtectionLevel.NONE, QuarantineMode.SYNCHRONOUS, 0,
                        trace.config().pages(), 1, trace.config().serials(), trace.config().generations(), -1)).build(), otherMemory);
                int t = other.tenants().register("tenant-0");
                int n = Math.min(Math.min(3, geometry.usablePages()), trace.config().serials() > 0 ? trace.config().serials() : 3);
                long[] got = new long[n];
                other.allocate(t, Owners.request(1), LeaseKind.OWNER, n, got, 0);
                other.release(t, Owners.request(1), got, 0, 1, ReleaseReason.FINISHED); // one ended, the rest live
                otherIds = got;
            }
            return otherIds;
        }

        @Override
        public boolean farFromTheEnd() {
            return trace.config().serials() < 0;
        }

        // ------------------------------------------------------------ actors

        void advance(Actor a) {
            switch (a.phase) {
                case ALLOC -> allocate(a);
                case WRITE -> {
                    writePage(a, a.next);
                    if (a.spec.kind() == Kind.LOCAL) {
                        // Each decode step reads the whole context so far.
                        for (int i = 0; i <= a.next; i++) {
                            readChecked(a, a.pages[i], i * FuzzTrace.PAGE_TOKENS, tokensOn(a.spec, i), a.spec.id(), 0);
                        }
                    }
                    if (++a.next == a.spec.pages()) {
                        a.next = 0;
                        a.phase = a.spec.kind() == Kind.LOCAL ? Phase.READ : Phase.BEGIN;
                    }
                }
                case BEGIN -> begin(a);
                case TRANSFER -> transferPage(a);
                case COMMIT -> commit(a);
                case READ -> readBack(a);
                case FINISH -> finish(a);
                case DONE -> zombieWrite(a);
            }
        }

        void allocate(Actor a) {
            RequestSpec s = a.spec;
            if (s.prefix() >= 0 && !ensurePrefix(s.tenant(), s.prefix())) {
                return;
            }
            long[] pages = new long[s.pages()];
            if (!allocateChecked(s.tenant(), a.owner, pages, s.id())) {
                return;
            }
            if (s.prefix() >= 0) {
                long[] reader = new long[1];
                long[] proof = {resident.get(prefixKey(s.tenant(), s.prefix())).lease};
                if (!oracles.mintsOrRunsOut(() -> pool.share(s.tenant(), Owners.namespace(s.tenant()), proof, 0, 1, LeaseKind.READER,
                        s.tenant(), a.owner, reader, 0), s.id(), "sharing the prefix")) {
                    release(s.tenant(), a.owner, pages, ReleaseReason.ABORTED); // no reader: try again later
                    return;
                }
                oracles.minted(reader[0], s.tenant(), a.owner, LeaseKind.READER, false, s.id());
                a.prefixReader = reader[0];
            }
            a.pages = pages;
            a.pagesHeld = true;
            a.next = 0;
            a.phase = Phase.WRITE;
        }

        /**
         * Releases content leases the model knows, and ends them in the model. Every other release of holds
         * all of one kind goes by their pages ({@link KvPagePool#releaseHeldPages}, as the SGLang bridge frees
         * slots): it must find exactly the presented leases and release them all.
         */
        void release(int tenant, long holder, long[] leases, ReleaseReason reason) {
            LeaseKind kind = releases++ % 2 == 1 ? oneKind(leases) : null;
            if (kind == null) {
                pool.release(tenant, holder, leases, 0, leases.length, reason);
            } else {
                int[] pages = new int[leases.length];
                for (int i = 0; i < pages.length; i++) {
                    pages[i] = oracles.model().live(leases[i]).page();
                }
                long[] found = new long[leases.length];
                boolean released = rig.releaseByPages(pool, tenant, holder, kind, pages, reason, found);
                if (!released || !Arrays.equals(found, leases)) {
                    throw fail(Finding.Kind.INVARIANT, -1, "releaseHeldPages of pages " + Arrays.toString(pages) + " (" + kind
                            + " of tenant " + tenant + " " + Owners.describe(holder) + ") answered " + released + " with leases "
                            + Arrays.toString(found) + ", not the holds " + Arrays.toString(leases));
                }
            }
            oracles.end(leases, 0, leases.length);
        }

        /** The kind every one of {@code leases} (live in the model) is of, or null when they differ or there are none. */
        private LeaseKind oneKind(long[] leases) {
            LeaseKind kind = leases.length == 0 ? null : oracles.model().live(leases[0]).kind();
            for (long lease : leases) {
                if (oracles.model().live(lease).kind() != kind) {
                    return null;
                }
            }
            return kind;
        }

        /**
         * All-or-nothing allocation with the residue oracle on every page handed out; false on
         * "none", or when the lease ids ran out (the pool unchanged).
         */
        boolean allocateChecked(int tenant, long owner, long[] out, int request) {
            LeaseKind kind = Owners.isNamespace(owner) ? LeaseKind.NAMESPACE : LeaseKind.OWNER;
            boolean[] ok = new boolean[1];
            try {
                if (!oracles.mintsOrRunsOut(() -> ok[0] = pool.allocate(tenant, owner, kind, out.length, out, 0), request, "allocate")) {
                    return false;
                }
            } catch (ProtectionException x) {
                protectionErrors++;
                return false;
            }
            if (!ok[0]) {
                if (pool.lastShortfall().isEmpty()) {
                    throw unexpected(request, "allocation answered none without saying why");
                }
                return false;
            }
            oracles.minted(out, 0, out.length, tenant, owner, kind, true, request);
            for (long lease : out) {
                checkHandOut(pool.view().pageOf(lease), tenant, false, request);
            }
            return true;
        }

        void checkHandOut(int page, int tenant, boolean reclaimed, int request) {
            oracles.checkNotFailed(page, request);
            if (protectsBytes(trace.config().level()) && !residue.checkHandOut(page, tenant, reclaimed)) {
                findings.add(new Finding(Finding.Kind.RESIDUE, eventIndex, request, "page " + page + " handed to tenant " + tenant
                        + (reclaimed ? " (reclaimed)" : "") + " holds residue"));
            }
        }

        boolean ensurePrefix(int tenant, int id) {
            int key = prefixKey(tenant, id);
            if (resident.containsKey(key)) {
                return true;
            }
            long ns = Owners.namespace(tenant);
            Prefix sealedOne = sealedPrefixes.get(key);
            if (sealedOne != null) {
                long[] out = new long[1];
                long[] ref = {rig.reclaimReference(pool, sealedOne.sealedRef)};
                int[] hits = new int[1];
                try {
                    if (!oracles.mintsOrRunsOut(() -> hits[0] = pool.reclaim(tenant, ns, LeaseKind.NAMESPACE, ref, 0, 1, out, 0), -1,
                            "reclaim")) {
                        return false;
                    }
                } catch (ProtectionException x) {
                    protectionErrors++; // unsealing failed: the page is scrubbed and retired; the prefix is recomputed
                    hits[0] = 0;
                }
                if (hits[0] == 1) {
                    oracles.minted(out, 0, 1, tenant, ns, LeaseKind.NAMESPACE, true, -1);
                    checkHandOut(pool.view().pageOf(out[0]), tenant, true, -1);
                    sealedPrefixes.remove(key);
                    sealedOne.lease = out[0];
                    resident.put(key, sealedOne);
                    return true;
                }
                sealedPrefixes.remove(key);
            }
            long[] out = new long[1];
            if (!allocateChecked(tenant, ns, out, -1)) {
                return false;
            }
            Prefix p = new Prefix(tenant, id);
            p.lease = out[0];
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment slice = slice(data, FuzzTrace.PAGE_TOKENS);
                Canary.fill(slice, tenant, p.writer(), 0, FuzzTrace.PAGE_TOKENS, b, BYTES_PER_TOKEN);
                pool.write(tenant, ns, p.lease, b, 0, slice);
            }
            resident.put(key, p);
            return true;
        }

        void evict(int tenant) {
            for (Map.Entry<Integer, Prefix> e : resident.entrySet()) {
                Prefix p = e.getValue();
                if (p.tenant == tenant) {
                    resident.remove(e.getKey());
                    long sealedRef = PageHandles.sealedReference(pool.view().handleOf(p.lease));
                    release(tenant, Owners.namespace(tenant), new long[] {p.lease}, ReleaseReason.EVICTED);
                    if (pool.protectionOf(tenant).seals()) {
                        p.sealedRef = sealedRef;
                        sealedPrefixes.put(e.getKey(), p);
                    }
                    return;
                }
            }
        }

        /**
         * Reclaims, in one call, every sealed page of {@code tenant} the trace knows: its evicted
         * prefixes and the pages its finished local requests released ({@code variant} 1: each
         * reference twice, the second must answer "gone"; 2: another tenant's reference too, which
         * must answer "gone"). A reclaimed prefix is resident again; a reclaimed request page must
         * hold exactly that request's KV, and goes back to the pool at once. A reclaim that fails in
         * the middle (a racing operator retired or broke its second key epoch after the first was
         * unsealed) hands nothing out; the pages it touched are watched until retired and zero.
         */
        void reclaimSealed(int tenant, int variant) {
            List<Object> items = new ArrayList<>(); // a prefix key (Integer) or a SealedPage
            List<Long> refs = new ArrayList<>();
            for (Map.Entry<Integer, Prefix> e : sealedPrefixes.entrySet()) {
                if (e.getValue().tenant == tenant) {
                    items.add(e.getKey());
                    refs.add(rig.reclaimReference(pool, e.getValue().sealedRef));
                }
            }
            List<SealedPage> pages = sealedPages.getOrDefault(tenant, List.of());
            for (SealedPage p : pages) {
                items.add(p);
                refs.add(rig.reclaimReference(pool, p.ref()));
            }
            sealedPages.remove(tenant); // reclaimed below, or gone
            int own = refs.size();
            if (variant == 1) {
                for (int i = 0; i < own; i++) {
                    items.add(items.get(i));
                    refs.add(refs.get(i));
                }
            }
            int foreign = -1;
            if (variant == 2) {
                for (Map.Entry<Integer, Prefix> e : sealedPrefixes.entrySet()) {
                    if (e.getValue().tenant != tenant && foreign < 0) {
                        foreign = refs.size();
                        items.add(null);
                        refs.add(e.getValue().sealedRef);
                    }
                }
            }
            if (refs.isEmpty()) {
                return;
            }
            long ns = Owners.namespace(tenant);
            long[] in = refs.stream().mapToLong(Long::longValue).toArray();
            long[] out = new long[in.length];
            java.util.Arrays.fill(out, -7);
            try {
                if (!oracles.mintsOrRunsOut(() -> pool.reclaim(tenant, ns, LeaseKind.NAMESPACE, in, 0, in.length, out, 0), -1,
                        "reclaim")) {
                    return;
                }
            } catch (ProtectionException x) {
                protectionErrors++;
                for (long l : out) {
                    if (l != -7) {
                        throw unexpected(-1, "a reclaim that failed (" + x.getMessage() + ") wrote a lease into its output");
                    }
                }
                for (int i = 0; i < own; i++) {
                    if (items.get(i) instanceof Integer key) {
                        sealedPrefixes.remove(key); // gone: the prefix is recomputed
                    }
                }
                return;
            }
            long[] hits = java.util.Arrays.stream(out).filter(l -> l != LeaseIds.NONE).toArray();
            oracles.minted(hits, 0, hits.length, tenant, ns, LeaseKind.NAMESPACE, true, -1); // one call: serials in any order
            List<Long> restored = new ArrayList<>();
            for (int i = 0; i < in.length; i++) {
                if (out[i] == LeaseIds.NONE) {
                    if (i < own && items.get(i) instanceof Integer key) {
                        sealedPrefixes.remove(key);
                    }
                    continue;
                }
                if (i >= own) {
                    throw fail(Finding.Kind.REFUSAL, -1, (i == foreign ? "another tenant's sealed reference" : "a sealed reference"
                            + " listed twice") + " was reclaimed by tenant " + tenant + " (lease " + out[i] + ")");
                }
                checkHandOut(pool.view().pageOf(out[i]), tenant, true, -1);
                if (items.get(i) instanceof Integer key) {
                    Prefix p = sealedPrefixes.remove(key);
                    p.lease = out[i];
                    resident.put(key, p);
                } else {
                    SealedPage page = (SealedPage) items.get(i);
                    readRestored(tenant, ns, out[i], page);
                    restored.add(out[i]);
                }
            }
            release(tenant, ns, restored.stream().mapToLong(Long::longValue).toArray(), ReleaseReason.EVICTED);
        }

        /** A request page reclaimed by its tenant must hold exactly what the request wrote there. */
        void readRestored(int tenant, long holder, long lease, SealedPage page) {
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment got = slice(data, page.tokens());
                MemorySegment want = slice(expected, page.tokens());
                try {
                    pool.read(tenant, holder, lease, b, 0, got);
                } catch (ReadBeforeWriteException x) {
                    throw fail(Finding.Kind.CORRUPT, (int) page.writer(), "page " + pool.view().pageOf(lease) + " reclaimed as request "
                            + page.writer() + "'s lacks slots it wrote: " + x.getMessage());
                }
                Canary.fill(want, tenant, page.writer(), page.firstPosition(), page.tokens(), b, BYTES_PER_TOKEN);
                if (got.mismatch(want) >= 0) {
                    long leaked = leaks.check(got, page.tokens(), b, BYTES_PER_TOKEN, tenant, page.writer(), tenant, page.writer());
                    throw fail(leaked > 0 ? Finding.Kind.LEAK : Finding.Kind.CORRUPT, (int) page.writer(), "page " + pool.view()
                            .pageOf(lease) + " reclaimed as request " + page.writer() + "'s does not hold its KV (buffer " + b + ")");
                }
            }
        }

        void writePage(Actor a, int i) {
            RequestSpec s = a.spec;
            a.written = i + 1;
            int n = tokensOn(s, i);
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment slice = slice(data, n);
                Canary.fill(slice, s.tenant(), s.id(), i * FuzzTrace.PAGE_TOKENS, n, b, BYTES_PER_TOKEN);
                pool.write(s.tenant(), a.owner, a.pages[i], b, 0, slice);
            }
        }

        void begin(Actor a) {
            RequestSpec s = a.spec;
            HandoffSender.Transfer[] t = new HandoffSender.Transfer[1];
            if (!oracles.mintsOrRunsOut(() -> t[0] = sender.begin(s.tenant(), s.id(), s.tokens(), a.pages, DECODE_PEER), s.id(),
                    "begin (the sender's claims)")) {
                return;
            }
            // The sender keeps its claims to itself: the model learns them from the one reader claim the request holds per page.
            long[] claims = new long[a.pages.length];
            for (int i = 0; i < claims.length; i++) {
                claims[i] = pool.view().leaseOf(pool.view().pageOf(a.pages[i]), s.tenant(), a.owner, LeaseKind.CLAIM_READER);
            }
            oracles.minted(claims, 0, claims.length, s.tenant(), a.owner, LeaseKind.CLAIM_READER, false, s.id());
            Reservation r;
            try {
                r = receiver.reserve(s.tenant(), s.id(), s.tokens(), PREFILL_PEER);
            } catch (ProtectionException x) {
                protectionErrors++;
                r = null;
            } catch (LeaseIdsExhaustedException | LeaseCapacityException x) {
                // Too few claim slots: refused before anything. Out of ids: the receiver allocates, then claims,
                // and out of ids in between it releases what it allocated.
                r = null;
            }
            if (r == null) {
                sender.complete(t[0]);
                oracles.end(claims, 0, claims.length);
                return;
            }
            long[] leases = new long[r.pageCount()];
            long[] writerClaims = new long[r.pageCount()];
            for (int i = 0; i < leases.length; i++) {
                leases[i] = r.lease(i);
                writerClaims[i] = r.claim(i);
            }
            oracles.minted(leases, 0, leases.length, s.tenant(), a.owner, LeaseKind.RESERVATION, true, s.id());
            oracles.minted(writerClaims, 0, writerClaims.length, s.tenant(), a.owner, LeaseKind.CLAIM_WRITER, false, s.id());
            for (int i = 0; i < r.pageCount(); i++) {
                checkHandOut(r.page(i), s.tenant(), false, s.id());
            }
            a.transfer = t[0];
            a.sendClaims = claims;
            a.reservation = r;
            a.resLeases = leases;
            a.next = 0;
            a.phase = Phase.TRANSFER;
        }

        /** One reserved page lands: the transport reads the source through its claim and writes raw bytes, then records them. */
        void transferPage(Actor a) {
            RequestSpec s = a.spec;
            int i = a.next;
            if (!a.transportDone && i != s.dropPage()) {
                int n = tokensOn(s, i);
                int page = a.reservation.page(i);
                for (int b = 0; b < geometry.bufferCount(); b++) {
                    MemorySegment slice = slice(data, n);
                    try {
                        sender.read(a.transfer, i, b, 0, slice);
                    } catch (StaleLeaseException x) {
                        // The request was aborted and its source released; a DMA engine reads on regardless,
                        // and the sender's claim keeps the source page (and its bytes) out of circulation.
                        rejections++;
                        memory.read(pool.view().pageOf(a.pages[i]), b, 0, slice);
                    }
                    memory.write(page, b, 0, slice);
                }
                try {
                    receiver.recordWritten(a.reservation, i, 0, n);
                } catch (FencedLeaseException | ReleasedLeaseException x) {
                    rejections++; // a late landing after the claim was fenced or dropped: the bytes sit in quarantine
                }
            }
            if (++a.next == s.pages()) {
                a.phase = a.cancelled || a.expired ? Phase.DONE : Phase.COMMIT;
            }
        }

        void commit(Actor a) {
            RequestSpec s = a.spec;
            Reservation r = a.reservation;
            if (r.outcome() != HandoffOutcome.PENDING) {
                a.phase = Phase.DONE;
                return;
            }
            sender.markSent(a.transfer, s.tokens());
            CommitResult[] c = new CommitResult[1];
            if (!oracles.mintsOrRunsOut(() -> c[0] = rig.commit(pool, receiver, r, s.tokens()), s.id(), "commit (the owner leases)")) {
                return; // out of ids for the owner leases: the reservation stays pending; the drain aborts it
            }
            if (c[0].committed()) {
                // The reservations become the request's owner leases (those the adapter handed over).
                for (int i = 0; i < a.resLeases.length; i++) {
                    if (r.lease(i) != a.resLeases[i]) {
                        oracles.end(a.resLeases, i, 1);
                        oracles.minted(r.lease(i), s.tenant(), a.owner, LeaseKind.OWNER, false, s.id());
                        a.resLeases[i] = r.lease(i);
                    }
                }
            } else {
                releaseReservation(a);
            }
            a.decided = true;
            releaseSource(a, ReleaseReason.FINISHED);
            acknowledgeIfDecided(a);
            a.committed = c[0].committed();
            a.phase = a.committed ? Phase.READ : Phase.DONE;
        }

        /** The receiver released the reservation's leases (refused, aborted, expired, finished): the model ends them. */
        void releaseReservation(Actor a) {
            if (!a.resReleased) {
                a.resReleased = true;
                oracles.end(a.resLeases, 0, a.resLeases.length);
            }
        }

        void releaseSource(Actor a, ReleaseReason reason) {
            if (a.pagesHeld) {
                a.pagesHeld = false;
                release(a.spec.tenant(), a.owner, a.pages, reason);
            }
        }

        void readBack(Actor a) {
            Long digest = readAll(a);
            if (digest != null) {
                readBack.put(a.spec.id(), digest);
            }
            a.phase = Phase.FINISH;
        }

        /**
         * Reads the request's prefix (unless it unmatched it) and every page; the digest of its own
         * pages, or null when the request failed (its pages are gone). The prefix is checked against
         * its writer's canary but kept out of the digest: whether a request still reads it when it
         * reads back depends on when its unmatch comes, which differs from the request run alone.
         */
        Long readAll(Actor a) {
            RequestSpec s = a.spec;
            long digest = 17;
            try {
                if (s.prefix() >= 0 && !a.unmatched) {
                    Prefix p = new Prefix(s.tenant(), s.prefix());
                    readChecked(a, a.prefixReader, 0, FuzzTrace.PAGE_TOKENS, p.writer(), digest);
                }
                for (int i = 0; i < s.pages(); i++) {
                    long lease = s.kind() == Kind.LOCAL ? a.pages[i] : a.reservation.lease(i);
                    digest = readChecked(a, lease, i * FuzzTrace.PAGE_TOKENS, tokensOn(s, i), s.id(), digest);
                }
                return digest;
            } catch (ReleasedLeaseException x) {
                rejections++; // its transfer expired after commit, which released its pages: the request fails
            } catch (ReadBeforeWriteException x) {
                findings.add(new Finding(Finding.Kind.CORRUPT, eventIndex, s.id(), (s.kind() == Kind.HANDOFF
                        ? "a committed handoff could not read its own KV: " : "") + x.getMessage()));
            }
            return null;
        }

        long readChecked(Actor a, long lease, int firstPosition, int n, long writer, long digest) {
            RequestSpec s = a.spec;
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment got = slice(data, n);
                MemorySegment want = slice(expected, n);
                pool.read(s.tenant(), a.owner, lease, b, 0, got);
                Canary.fill(want, s.tenant(), writer, firstPosition, n, b, BYTES_PER_TOKEN);
                if (got.mismatch(want) >= 0) {
                    long leaked = leaks.check(got, n, b, BYTES_PER_TOKEN, s.tenant(), s.id(), s.tenant(), writer);
                    if (leaked > 0) {
                        findings.add(new Finding(Finding.Kind.LEAK, eventIndex, s.id(), leaked + " bytes of another request: "
                                + leaks.firstLeak().describe()));
                    } else {
                        findings.add(new Finding(Finding.Kind.CORRUPT, eventIndex, s.id(), "page " + pool.view().pageOf(lease)
                                + " buffer " + b + " read back something other than its writer's content (zeros or noise)"));
                    }
                }
                for (long at = 0; at < got.byteSize(); at += 8) {
                    digest = mix(digest, got.get(ValueLayout.JAVA_LONG_UNALIGNED, at));
                }
            }
            return digest;
        }

        void finish(Actor a) {
            readAll(a); // the last decode step reads the whole context once more
            end(a);
        }

        void end(Actor a) {
            RequestSpec s = a.spec;
            if (s.kind() == Kind.LOCAL) {
                releaseLocal(a, ReleaseReason.FINISHED);
            } else if (!a.finished) {
                a.finished = true;
                rig.finish(pool, receiver, a.reservation);
                releaseReservation(a);
            }
            a.phase = Phase.DONE;
        }

        void releaseLocal(Actor a, ReleaseReason reason) {
            if (!a.pagesHeld) {
                return;
            }
            if (a.spec.prefix() >= 0 && !a.unmatched) {
                // A reader lease outlives an eviction of the prefix: the page stays the namespace's content until the last reader goes.
                release(a.spec.tenant(), a.owner, new long[] {a.prefixReader}, reason);
            }
            a.pagesHeld = false;
            if (pool.protectionOf(a.spec.tenant()).seals()) {
                List<SealedPage> kept = sealedPages.computeIfAbsent(a.spec.tenant(), t -> new ArrayList<>());
                for (int i = 0; i < a.written; i++) {
                    kept.add(new SealedPage(PageHandles.sealedReference(pool.view().handleOf(a.pages[i])), a.spec.id(),
                            i * FuzzTrace.PAGE_TOKENS, tokensOn(a.spec, i)));
                }
                kept.subList(0, Math.max(0, kept.size() - SEALED_PAGES_KEPT)).clear();
            }
            release(a.spec.tenant(), a.owner, a.pages, reason);
        }

        /** A forward still in flight for a request that ended writes through its old lease: it must be refused. */
        void zombieWrite(Actor a) {
            if (a.zombieTried) {
                return;
            }
            long lease;
            if (a.spec.kind() == Kind.LOCAL && a.pages != null && !a.pagesHeld) {
                lease = a.pages[0];
            } else if (a.spec.kind() == Kind.HANDOFF && a.committed && a.finished) {
                lease = a.reservation.lease(0);
            } else {
                return;
            }
            a.zombieTried = true;
            MemorySegment slice = slice(data, 1);
            Canary.fill(slice, a.spec.tenant(), a.spec.id(), 0, 1, 0, BYTES_PER_TOKEN);
            try {
                pool.write(a.spec.tenant(), a.owner, lease, 0, 0, slice);
            } catch (ReleasedLeaseException x) {
                rejections++;
                return;
            }
            throw unexpected(a.spec.id(), "a late write through the lease of an ended request was accepted (page "
                    + pool.view().pageOf(lease) + ")");
        }

        void cancel(Actor a) {
            if (a.cancelled || a.phase == Phase.DONE) {
                return;
            }
            a.cancelled = true;
            RequestSpec s = a.spec;
            if (s.kind() == Kind.LOCAL) {
                releaseLocal(a, ReleaseReason.ABORTED);
                a.phase = Phase.DONE;
                return;
            }
            if (a.committed) {
                end(a);
                return;
            }
            if (a.reservation != null) {
                receiver.abort(a.reservation);
                releaseReservation(a);
                a.decided = true;
                acknowledgeIfDecided(a);
            }
            releaseSource(a, ReleaseReason.ABORTED);
            // The transport does not hear of the cancel: it keeps landing pages until it is done.
            if (a.phase != Phase.TRANSFER) {
                a.phase = Phase.DONE;
            }
        }

        /**
         * The transport's "done": the sender's reader claims drop at once; the receiver's writer claims
         * drop once it decided the request, since its commit reads what the claims recorded (the
         * engine commits, or refuses, before it acknowledges).
         */
        void acknowledge(Actor a) {
            if (a.transfer == null || a.transportDone) {
                return;
            }
            a.transportDone = true;
            sender.complete(a.transfer);
            oracles.end(a.sendClaims, 0, a.sendClaims.length);
            acknowledgeIfDecided(a);
        }

        void acknowledgeIfDecided(Actor a) {
            if (a.transportDone && a.decided && !a.acknowledged) {
                a.acknowledged = true;
                receiver.acknowledge(a.reservation);
                endReservationClaims(a);
            }
        }

        void endReservationClaims(Actor a) {
            if (!a.resClaimsEnded) {
                a.resClaimsEnded = true;
                for (int i = 0; i < a.reservation.pageCount(); i++) {
                    oracles.end(new long[] {a.reservation.claim(i)}, 0, 1);
                }
            }
        }

        void expire(Actor a) {
            if (a.reservation == null || a.transportDone || a.expired) {
                return;
            }
            a.expired = true;
            a.decided = true;
            rig.expire(pool, receiver, a.reservation);
            // An expiry fences the transfer's claims (they hold the pages until it drains) and releases the reservation.
            if (!a.resClaimsEnded) {
                for (int i = 0; i < a.reservation.pageCount(); i++) {
                    oracles.model().fence(a.reservation.claim(i));
                }
            }
            releaseReservation(a);
            if (!a.committed) {
                releaseSource(a, ReleaseReason.ABORTED);
                if (a.phase == Phase.COMMIT) {
                    a.phase = Phase.DONE;
                }
            }
        }

        // ------------------------------------------------------------ lease misuse

        /** The request presents a hostile batch: refused with the contract's exception, nothing changed. */
        void misuse(Actor a, Misuse m) {
            long[] batch = m.batch(this, a.spec.tenant(), a.owner);
            oracles.presentRefused(m.call(), a.spec.tenant(), a.owner, batch, a.spec.id());
        }

        /**
         * The request ends its read of its prefix ({@code PrefixCache.unmatch}): the first time it
         * holds a reader lease, its release; a read through the released lease must then be
         * refused. Again, or before it ever matched, it presents a reader lease it does not hold
         * (the released one, or the cache's own lease): refused, nothing changed.
         */
        void unmatch(Actor a) {
            RequestSpec s = a.spec;
            if (s.prefix() >= 0 && a.pagesHeld && !a.unmatched) {
                long[] reader = {a.prefixReader};
                rig.present(pool, BatchCall.UNMATCH, s.tenant(), a.owner, reader, 1, new long[1], slice(data, 1));
                oracles.end(reader, 0, 1);
                a.unmatched = true;
                try {
                    pool.read(s.tenant(), a.owner, a.prefixReader, 0, 0, slice(data, FuzzTrace.PAGE_TOKENS));
                } catch (ReleasedLeaseException x) {
                    rejections++;
                    return;
                }
                throw fail(Finding.Kind.REFUSAL, s.id(), "a read through the reader lease the request unmatched was served (page "
                        + pool.view().pageOf(a.prefixReader) + ")");
            }
            long presented = a.prefixReader;
            if (presented == LeaseIds.NONE) {
                Prefix p = resident.get(prefixKey(s.tenant(), Math.max(0, s.prefix())));
                presented = p != null ? p.lease : LeaseIds.NONE;
            }
            oracles.presentRefused(BatchCall.UNMATCH, s.tenant(), a.owner, new long[] {presented}, s.id());
        }

        /**
         * Claim churn on the request's pages: {@code rounds} times a writer claim on each, fenced,
         * then dropped. Near the end of the ids, the claim is refused whole and changes nothing.
         */
        void churn(Actor a, int rounds) {
            RequestSpec s = a.spec;
            List<LeaseModel.Hold> held = oracles.model().heldBy(s.tenant(), a.owner, BatchCall.CLAIM.accepts());
            long[] leases = held.stream().mapToLong(LeaseModel.Hold::id).toArray();
            if (leases.length == 0) {
                return;
            }
            for (int round = 0; round < Math.max(1, rounds % 9); round++) {
                long[] claims = new long[leases.length];
                if (!oracles.mintsOrRunsOut(() -> rig.present(pool, BatchCall.CLAIM, s.tenant(), a.owner, leases, leases.length, claims,
                        slice(data, 1)), s.id(), "claim")) {
                    return;
                }
                oracles.minted(claims, 0, claims.length, s.tenant(), a.owner, LeaseKind.CLAIM_WRITER, false, s.id());
                int fenced = (claims.length + 1) / 2;
                rig.present(pool, BatchCall.FENCE_CLAIMS, s.tenant(), a.owner, claims, fenced, null, null);
                for (int i = 0; i < fenced; i++) {
                    oracles.model().fence(claims[i]);
                }
                rig.present(pool, BatchCall.DROP_CLAIMS, s.tenant(), a.owner, claims, claims.length, null, null);
                oracles.end(claims, 0, claims.length);
            }
        }

        // ------------------------------------------------------------ drain

        void drain() {
            for (Actor a : actors.values()) {
                if (a.spec.kind() == Kind.LOCAL) {
                    releaseLocal(a, ReleaseReason.FINISHED);
                    continue;
                }
                releaseSource(a, ReleaseReason.ABORTED);
                if (a.committed && !a.finished) {
                    a.finished = true;
                    rig.finish(pool, receiver, a.reservation);
                    releaseReservation(a);
                } else if (a.reservation != null && !a.decided) {
                    receiver.abort(a.reservation);
                    releaseReservation(a);
                }
                a.decided = true;
                acknowledge(a);
                acknowledgeIfDecided(a);
            }
            for (Prefix p : List.copyOf(resident.values())) {
                evict(p.tenant);
            }
            oracles.checkHolds();
            // Each boundary retries failed protection once: a few more than the lag let a cleared fault drain.
            for (int i = 0; i < trace.config().lagSteps() + 2 || (i < DRAIN_STEPS && pool.snapshot().quarantined() > 0); i++) {
                endStep();
            }
            PoolSnapshot s = pool.snapshot();
            if (s.owned() != 0 || s.quarantined() != 0 || oracles.pendingFailedPages() != 0) {
                findings.add(new Finding(Finding.Kind.INVARIANT, -1, -1, "the pool did not recover after every request ended: " + s
                        + (oracles.pendingFailedPages() != 0 ? "; " + oracles.pendingFailedPages() + " page(s) whose protection failed"
                                + " are not retired" : "")));
            }
            if (protectsBytes(trace.config().level())) {
                for (int p = geometry.firstUsablePage(); p < geometry.pageCount(); p++) {
                    if (pool.view().stateOf(p) == PageState.FREE && !residue.checkHandOut(p, -1, false)) {
                        findings.add(new Finding(Finding.Kind.RESIDUE, -1, -1, "free page " + p + " holds residue after the drain"));
                    }
                }
            }
        }

        @Override
        public void close() {
            pool.close();
            if (other != null) {
                other.close();
                otherMemory.close();
            }
            residue.close();
            arena.close();
            base.close();
        }
    }

    static int prefixKey(int tenant, int id) {
        return tenant * 8 + id;
    }

    static int tokensOn(RequestSpec s, int page) {
        return Math.min(FuzzTrace.PAGE_TOKENS, s.tokens() - page * FuzzTrace.PAGE_TOKENS);
    }

    static MemorySegment slice(MemorySegment scratch, int tokens) {
        return scratch.asSlice(0, (long) tokens * BYTES_PER_TOKEN);
    }

    static long mix(long h, long v) {
        h ^= v + 0x9E37_79B9_7F4A_7C15L + (h << 6) + (h >>> 2);
        h *= 0xBF58_476D_1CE4_E5B9L;
        return h ^ (h >>> 31);
    }
}
