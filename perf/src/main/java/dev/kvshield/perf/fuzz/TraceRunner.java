package dev.kvshield.perf.fuzz;

import dev.kvshield.admission.AdmissionPolicy;
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
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
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
 * {@link ResidueOracle}; a cancelled request's late write must be refused. After the schedule
 * the trace drains (every transfer acknowledged, every page released, step boundaries run): the pool
 * must own and quarantine nothing, and every free page must be zero.
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
        /** The request's reader lease on its prefix page. */
        long prefixReader;
        boolean cancelled;
        boolean zombieTried;
        HandoffSender.Transfer transfer;
        Reservation reservation;
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

    private final class Run implements AutoCloseable {
        final FuzzTrace trace;
        final Rig rig;
        final PoolGeometry geometry;
        final OffHeapPageMemory base;
        final KvPagePool pool;
        final PageMemory memory;
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
        final List<Finding> findings = new ArrayList<>();
        final Map<Integer, Long> readBack = new TreeMap<>();
        int eventIndex;
        int rejections;
        int protectionErrors;

        Run(FuzzTrace trace, Rig rig) {
            this.trace = trace;
            this.rig = rig;
            FuzzTrace.Config c = trace.config();
            geometry = geometry(c.pages());
            base = OffHeapPageMemory.allocate(geometry);
            memory = rig.memory(base);
            PoolConfig.Builder config = PoolConfig.builder(geometry).level(c.level()).quarantineMode(c.mode())
                    .releaseLagSteps(c.lagSteps()).poolId("fuzz")
                    .admission(new AdmissionPolicy(geometry.capacityTokens(), 0, false));
            if (sealer != null) {
                config.sealer(sealer);
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
            for (RequestSpec r : trace.requests()) {
                actors.put(r.id(), new Actor(r));
            }
        }

        RunResult execute() {
            List<Event> events = trace.events();
            try {
                for (eventIndex = 0; eventIndex < events.size(); eventIndex++) {
                    apply(events.get(eventIndex));
                }
                eventIndex = -1;
                drain();
            } catch (Abort stopped) {
                // Recorded as a finding where it was thrown.
            }
            long failures = (long) (pool.metrics().protectionFailureCount() + pool.metrics().verifyFailureCount());
            return new RunResult(List.copyOf(findings), Map.copyOf(readBack), events.size(), rejections, protectionErrors, failures);
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
                }
            } catch (Abort a) {
                throw a;
            } catch (RuntimeException | Error x) {
                throw unexpected(e.action() == FuzzTrace.Action.EVICT || !e.action().targetsRequest() ? -1 : e.target(),
                        "event '" + e + "' threw " + x);
            }
        }

        Abort unexpected(int request, String message) {
            findings.add(new Finding(Finding.Kind.INVARIANT, eventIndex, request, message));
            return new Abort();
        }

        void endStep() {
            try {
                pool.endStep();
            } catch (ProtectionException x) {
                protectionErrors++;
            }
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
            a.pages = pages;
            a.pagesHeld = true;
            if (s.prefix() >= 0) {
                long[] reader = new long[1];
                pool.share(s.tenant(), Owners.namespace(s.tenant()), new long[] {resident.get(prefixKey(s.tenant(), s.prefix())).lease}, 0,
                        1, LeaseKind.READER, s.tenant(), a.owner, reader, 0);
                a.prefixReader = reader[0];
            }
            a.next = 0;
            a.phase = Phase.WRITE;
        }

        /** All-or-nothing allocation with the residue oracle on every page handed out; false on "none". */
        boolean allocateChecked(int tenant, long owner, long[] out, int request) {
            boolean ok;
            try {
                ok = pool.allocate(tenant, owner, Owners.isNamespace(owner) ? LeaseKind.NAMESPACE : LeaseKind.OWNER, out.length, out, 0);
            } catch (ProtectionException x) {
                protectionErrors++;
                return false;
            }
            if (!ok) {
                if (pool.lastShortfall().isEmpty()) {
                    throw unexpected(request, "allocation answered none without saying why");
                }
                return false;
            }
            for (long lease : out) {
                checkHandOut(pool.view().pageOf(lease), tenant, false, request);
            }
            return true;
        }

        void checkHandOut(int page, int tenant, boolean reclaimed, int request) {
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
                long ref = rig.reclaimReference(pool, sealedOne.sealedRef);
                if (pool.reclaim(tenant, ns, LeaseKind.NAMESPACE, new long[] {ref}, 0, 1, out, 0) == 1) {
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
                    pool.release(tenant, Owners.namespace(tenant), new long[] {p.lease}, 0, 1, ReleaseReason.EVICTED);
                    if (pool.protectionOf(tenant).seals()) {
                        p.sealedRef = sealedRef;
                        sealedPrefixes.put(e.getKey(), p);
                    }
                    return;
                }
            }
        }

        void writePage(Actor a, int i) {
            RequestSpec s = a.spec;
            int n = tokensOn(s, i);
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment slice = slice(data, n);
                Canary.fill(slice, s.tenant(), s.id(), i * FuzzTrace.PAGE_TOKENS, n, b, BYTES_PER_TOKEN);
                pool.write(s.tenant(), a.owner, a.pages[i], b, 0, slice);
            }
        }

        void begin(Actor a) {
            RequestSpec s = a.spec;
            HandoffSender.Transfer t = sender.begin(s.tenant(), s.id(), s.tokens(), a.pages, DECODE_PEER);
            Reservation r;
            try {
                r = receiver.reserve(s.tenant(), s.id(), s.tokens(), PREFILL_PEER);
            } catch (ProtectionException x) {
                protectionErrors++;
                r = null;
            }
            if (r == null) {
                sender.complete(t);
                return;
            }
            for (int i = 0; i < r.pageCount(); i++) {
                checkHandOut(r.page(i), s.tenant(), false, s.id());
            }
            a.transfer = t;
            a.reservation = r;
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
            CommitResult c = rig.commit(pool, receiver, r, s.tokens());
            a.decided = true;
            releaseSource(a, ReleaseReason.FINISHED);
            acknowledgeIfDecided(a);
            a.committed = c.committed();
            a.phase = a.committed ? Phase.READ : Phase.DONE;
        }

        void releaseSource(Actor a, ReleaseReason reason) {
            if (a.pagesHeld) {
                a.pagesHeld = false;
                pool.release(a.spec.tenant(), a.owner, a.pages, 0, a.pages.length, reason);
            }
        }

        void readBack(Actor a) {
            Long digest = readAll(a);
            if (digest != null) {
                readBack.put(a.spec.id(), digest);
            }
            a.phase = Phase.FINISH;
        }

        /** Reads the request's prefix and every page; its digest, or null when the request failed (its pages are gone). */
        Long readAll(Actor a) {
            RequestSpec s = a.spec;
            long digest = 17;
            try {
                if (s.prefix() >= 0) {
                    Prefix p = new Prefix(s.tenant(), s.prefix());
                    digest = readChecked(a, a.prefixReader, 0, FuzzTrace.PAGE_TOKENS, p.writer(), digest);
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
            }
            a.phase = Phase.DONE;
        }

        void releaseLocal(Actor a, ReleaseReason reason) {
            if (!a.pagesHeld) {
                return;
            }
            if (a.spec.prefix() >= 0) {
                // A reader lease outlives an eviction of the prefix: the page stays the namespace's content until the last reader goes.
                pool.release(a.spec.tenant(), a.owner, new long[] {a.prefixReader}, 0, 1, reason);
            }
            a.pagesHeld = false;
            pool.release(a.spec.tenant(), a.owner, a.pages, 0, a.pages.length, reason);
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
            acknowledgeIfDecided(a);
        }

        void acknowledgeIfDecided(Actor a) {
            if (a.transportDone && a.decided && !a.acknowledged) {
                a.acknowledged = true;
                receiver.acknowledge(a.reservation);
            }
        }

        void expire(Actor a) {
            if (a.reservation == null || a.transportDone || a.expired) {
                return;
            }
            a.expired = true;
            a.decided = true;
            rig.expire(pool, receiver, a.reservation);
            if (!a.committed) {
                releaseSource(a, ReleaseReason.ABORTED);
                if (a.phase == Phase.COMMIT) {
                    a.phase = Phase.DONE;
                }
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
                } else if (a.reservation != null && !a.decided) {
                    receiver.abort(a.reservation);
                }
                a.decided = true;
                acknowledge(a);
                acknowledgeIfDecided(a);
            }
            for (Prefix p : List.copyOf(resident.values())) {
                evict(p.tenant);
            }
            // Each boundary retries failed protection once: a few more than the lag let a cleared fault drain.
            for (int i = 0; i < trace.config().lagSteps() + 2 || (i < DRAIN_STEPS && pool.snapshot().quarantined() > 0); i++) {
                endStep();
            }
            PoolSnapshot s = pool.snapshot();
            if (s.owned() != 0 || s.quarantined() != 0) {
                findings.add(new Finding(Finding.Kind.INVARIANT, -1, -1, "the pool did not recover after every request ended: " + s));
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
