package dev.kvshield.audit;

import dev.kvshield.audit.internal.ExposureTracker;
import dev.kvshield.audit.internal.RecordChain;
import dev.kvshield.claims.ClaimKind;
import dev.kvshield.metrics.MetricNames;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.util.ArrayList;
import java.util.Base64;
import java.util.BitSet;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.IntFunction;
import java.util.function.LongSupplier;

/**
 * The tamper-evident audit trail of one pool (one tensor-parallel rank): one JSON line per page
 * event, one summary per finished request, SHA-256 hash-chained, with Ed25519-signed checkpoints of
 * the chain head every {@link AuditConfig#checkpointEveryRecords()} records and at close, each also
 * shipped off the host. Records carry ids, generations, slot ranges, key epochs and peers — never
 * KV content and never key material.
 *
 * <p>Fail-closed: if the sink cannot write, a pool where {@code COMPLIANCE} applies (the pool's
 * level, or any tenant's, e.g. a regulated tenant) stops handing out pages
 * ({@link KvPagePool#haltHandOuts}) with the sink's error as the reason; under other levels the pool
 * keeps running and every record from then on is counted as dropped
 * ({@code kvshield.audit.records{outcome=dropped}}). A failed trail does not write again; an operator
 * starts a new one.
 *
 * <p>Thread-safe. Page events arrive under the pool lock; they are only stored (no allocation)
 * and written at the next step boundary, or when the buffer fills.
 *
 * <p>Implementation notes: events go into primitive ring arrays guarded by {@link #lock}; the
 * flush encodes them with one reused {@link RecordChain}, feeds them to an
 * {@link ExposureTracker} (so request summaries and alarms name the requests affected), hands the
 * batch to the sink in one call, and only after the sink accepted it signs and ships a checkpoint.
 * Lock order is pool lock, then trail lock; the trail never calls into the pool except
 * {@code haltHandOuts}, the lock-free tenant registry and configuration reads.
 */
public final class AuditTrail implements PageEventListener, AutoCloseable {
    private static final System.Logger LOG = System.getLogger(AuditTrail.class.getName());
    private static final byte SUMMARY = -1;
    private static final PageEventType[] TYPES = PageEventType.values();
    private static final String[] TYPE_NAMES = names(TYPES);
    private static final String[] LEVEL_NAMES = names(ProtectionLevel.values());
    private static final String[] RELEASE_NAMES = names(ReleaseReason.values());
    private static final String[] RETIRE_NAMES = names(RetireReason.values());
    private static final String[] KIND_NAMES = names(ClaimKind.values());
    private static final String[] OUTCOME_NAMES = names(RequestOutcome.values());

    /** What a detached trail (a replay, a test, a pool in another process) is about. */
    public record Scope(String poolId, int rank, int pageCount, int slotsPerPage, ProtectionLevel level,
            IntFunction<String> tenantNames) {}

    private final AuditConfig config;
    private final KvPagePool pool;
    private final Scope scope;
    private final ReentrantLock lock = new ReentrantLock();

    // Event ring, guarded by lock.
    private final byte[] types;
    private final int[] pages;
    private final int[] generations;
    private final int[] tenants;
    private final long[] owners;
    private final long[] details;
    private final long[] peers;
    private final byte[] kinds;
    private final long[] monoNanos;
    private final long[] steps;
    private int buffered;
    private long step;

    // Writing state, guarded by lock.
    private final RecordChain chain = new RecordChain();
    private final ExposureTracker tracker;
    private final BitSet declaredTenants = new BitSet();
    private final List<String> lines = new ArrayList<>();
    private long recordsSinceCheckpoint;
    private String failure;
    private boolean closed;
    private final LongSupplier monoClockNanos;
    private final long wallAtStartMillis;
    private final long monoAtStartNanos;

    private final Counter written;
    private final Counter dropped;
    private final Counter alarms;
    private final Counter checkpoints;
    private final Counter shipFailures;

    private AuditTrail(AuditConfig config, KvPagePool pool, Scope scope, MeterRegistry registry, LongSupplier monoClockNanos,
            long wallAtStartMillis) {
        this.config = config;
        this.pool = pool;
        this.scope = scope;
        this.monoClockNanos = monoClockNanos;
        this.wallAtStartMillis = wallAtStartMillis;
        this.monoAtStartNanos = monoClockNanos.getAsLong();
        int n = config.bufferRecords();
        types = new byte[n];
        pages = new int[n];
        generations = new int[n];
        tenants = new int[n];
        owners = new long[n];
        details = new long[n];
        peers = new long[n];
        kinds = new byte[n];
        monoNanos = new long[n];
        steps = new long[n];
        tracker = new ExposureTracker(scope.pageCount(), scope.slotsPerPage());
        Tags tags = Tags.of("pool", scope.poolId(), "rank", Integer.toString(scope.rank()));
        written = Counter.builder(MetricNames.AUDIT_RECORDS).tags(tags.and("outcome", "written")).baseUnit("records").register(registry);
        dropped = Counter.builder(MetricNames.AUDIT_RECORDS).tags(tags.and("outcome", "dropped")).baseUnit("records").register(registry);
        alarms = Counter.builder(MetricNames.AUDIT_ALARMS).tags(tags).baseUnit("pages").register(registry);
        checkpoints = Counter.builder(MetricNames.AUDIT_CHECKPOINTS).tags(tags).baseUnit("checkpoints").register(registry);
        shipFailures = Counter.builder(MetricNames.AUDIT_SHIP_FAILURES).tags(tags).baseUnit("checkpoints").register(registry);
    }

    /**
     * Starts a trail for {@code pool}: writes its opening record and adds it as a page-event
     * listener. If the opening record cannot be written the trail is failed at once (and a
     * {@code COMPLIANCE} pool halted).
     */
    public static AuditTrail attach(KvPagePool pool, AuditConfig config) {
        Scope scope = new Scope(pool.config().poolId(), pool.config().rank(), pool.geometry().pageCount(),
                pool.geometry().pageSizeTokens(), pool.config().level(), t -> pool.tenants().name(t));
        AuditTrail trail = new AuditTrail(config, pool, scope, pool.config().meterRegistry(), System::nanoTime,
                System.currentTimeMillis());
        trail.open();
        pool.addListener(trail);
        return trail;
    }

    /** Starts a trail fed by hand (replays, tests): events are whatever the caller delivers. */
    public static AuditTrail detached(AuditConfig config, Scope scope) {
        return detached(config, scope, System::nanoTime, System.currentTimeMillis());
    }

    /**
     * A detached trail whose records take their times from {@code monoClockNanos} (monotonic
     * nanoseconds) and {@code wallAtStartMillis} (the wall clock at the clock's first reading), so
     * that its record bytes are reproducible (the golden-format test).
     */
    static AuditTrail detached(AuditConfig config, Scope scope, LongSupplier monoClockNanos, long wallAtStartMillis) {
        MeterRegistry registry = config.meterRegistry() != null ? config.meterRegistry() : new SimpleMeterRegistry();
        AuditTrail trail = new AuditTrail(config, null, scope, registry, monoClockNanos, wallAtStartMillis);
        trail.open();
        return trail;
    }

    private void open() {
        lock.lock();
        try {
            long now = monoClockNanos.getAsLong();
            common(chain.begin("open"), now, step).field("pageCount", scope.pageCount())
                    .field("slotsPerPage", scope.slotsPerPage()).field("level", LEVEL_NAMES[scope.level().ordinal()])
                    .field("signer", config.signingKey().fingerprint());
            lines.add(chain.end());
            write(false, false);
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- events (under the pool lock)

    @Override
    public void onPageEvent(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
        store((byte) type.ordinal(), page, generation, tenant, owner, detail, (byte) -1, 0);
    }

    @Override
    public void onClaimEvent(PageEventType type, int page, int generation, int tenant, long owner, long claimId, ClaimKind kind,
            long peer) {
        store((byte) type.ordinal(), page, generation, tenant, owner, claimId, (byte) kind.ordinal(), peer);
    }

    @Override
    public void onStepBoundary(long step) {
        lock.lock();
        try {
            this.step = step;
            flush0();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Records that a request ended; its summary (pages read with generations, whether any read
     * reached another tenant's data or unwritten slots, rejections, pages whose verification its
     * release failed, outcome) is written at the next step boundary. Call once per request, after
     * its last page event: until then the trail keeps what the request read in memory.
     */
    public void requestFinished(int tenant, long request, RequestOutcome outcome) {
        if (outcome == null) {
            throw new IllegalArgumentException("outcome must not be null");
        }
        store(SUMMARY, -1, 0, tenant, Owners.request(request), outcome.ordinal(), (byte) -1, 0);
    }

    private void store(byte type, int page, int generation, int tenant, long owner, long detail, byte kind, long peer) {
        lock.lock();
        try {
            if (failure != null || closed) {
                dropped.increment();
                return;
            }
            int i = buffered++;
            types[i] = type;
            pages[i] = page;
            generations[i] = generation;
            tenants[i] = tenant;
            owners[i] = owner;
            details[i] = detail;
            kinds[i] = kind;
            peers[i] = peer;
            monoNanos[i] = monoClockNanos.getAsLong();
            steps[i] = step;
            if (buffered == types.length) {
                flush0();
            }
        } finally {
            lock.unlock();
        }
    }

    /** Writes everything buffered now (normally the step boundary does). */
    public void flush() {
        lock.lock();
        try {
            flush0();
        } finally {
            lock.unlock();
        }
    }

    // ---------------------------------------------------------------- encoding and writing

    private void flush0() {
        if (failure != null || closed) {
            return;
        }
        for (int i = 0; i < buffered; i++) {
            encode(i);
        }
        buffered = 0;
        write(recordsSinceCheckpoint + lines.size() >= config.checkpointEveryRecords(), false);
    }

    /** Hands {@link #lines} (plus a checkpoint if asked) to the sink; on failure fails the trail. */
    private void write(boolean checkpoint, boolean last) {
        if (lines.isEmpty() && !checkpoint) {
            return;
        }
        String checkpointLine = checkpoint ? checkpointLine(last) : null;
        int n = lines.size();
        try {
            config.sink().append(lines);
            if (checkpoint) {
                config.sink().sync();
            }
        } catch (Exception e) {
            fail(e, n);
            return;
        } finally {
            lines.clear();
        }
        written.increment(n);
        recordsSinceCheckpoint += n;
        if (checkpoint) {
            recordsSinceCheckpoint = 0;
            checkpoints.increment();
            ship(checkpointLine);
        }
    }

    private String checkpointLine(boolean last) {
        long upTo = chain.nextSeq() - 1;
        String head = chain.head();
        byte[] sig = config.signingKey().sign(RecordChain.checkpointMessage(scope.poolId(), scope.rank(), upTo, head));
        common(chain.begin("checkpoint"), monoClockNanos.getAsLong(), step).field("upTo", upTo).field("head", head)
                .field("signer", config.signingKey().fingerprint()).field("sig", Base64.getEncoder().encodeToString(sig))
                .field("final", last);
        String line = chain.end();
        lines.add(line);
        return line;
    }

    private void ship(String checkpointLine) {
        for (CheckpointShipper s : config.shippers()) {
            try {
                s.ship(checkpointLine);
            } catch (Exception e) {
                shipFailures.increment();
                LOG.log(System.Logger.Level.WARNING, "pool " + scope.poolId() + " rank " + scope.rank()
                        + ": shipping an audit checkpoint failed (it stays in the log): " + e);
            }
        }
    }

    private void fail(Exception e, int lost) {
        failure = "audit sink " + config.sink().describe() + " cannot write: " + e;
        dropped.increment(lost);
        if (complianceApplies()) {
            if (pool != null) {
                pool.haltHandOuts(failure + "; COMPLIANCE does not run unaudited");
            }
        } else {
            LOG.log(System.Logger.Level.ERROR, "pool " + scope.poolId() + " rank " + scope.rank() + ": " + failure
                    + "; the pool keeps running (no COMPLIANCE) and counts every record as dropped");
        }
    }

    private boolean complianceApplies() {
        if (scope.level() == ProtectionLevel.COMPLIANCE) {
            return true;
        }
        if (pool != null) {
            for (int t = 0; t < pool.tenants().size(); t++) {
                if (pool.levelOf(t) == ProtectionLevel.COMPLIANCE) {
                    return true;
                }
            }
        }
        return false;
    }

    private RecordChain common(RecordChain c, long mono, long atStep) {
        return c.field("mono", mono).field("wall", wallAtStartMillis + (mono - monoAtStartNanos) / 1_000_000)
                .field("pool", scope.poolId()).field("rank", scope.rank()).field("step", atStep);
    }

    /** Writes a tenant's record before its first event, stamped with that event's times. */
    private void declare(int tenant, long mono, long atStep) {
        if (tenant < 0 || declaredTenants.get(tenant)) {
            return;
        }
        declaredTenants.set(tenant);
        String name = scope.tenantNames().apply(tenant);
        ProtectionLevel level = pool != null ? pool.levelOf(tenant) : scope.level();
        boolean regulated = pool != null && pool.tenants().policy(tenant).regulated();
        common(chain.begin("tenant"), mono, atStep).field("tenant", tenant).field("name", name)
                .field("level", LEVEL_NAMES[level.ordinal()]).field("regulated", regulated);
        lines.add(chain.end());
    }

    private static void owner(RecordChain c, String prefix, long owner) {
        if (Owners.isValid(owner)) {
            String kind = Owners.isNamespace(owner) ? "ns" : "req";
            c.field(prefix.isEmpty() ? kind : prefix + Character.toUpperCase(kind.charAt(0)) + kind.substring(1), Owners.id(owner));
        }
    }

    private void encode(int i) {
        int tenant = tenants[i];
        declare(tenant, monoNanos[i], steps[i]);
        if (types[i] == SUMMARY) {
            summary(i);
            return;
        }
        int typeOrdinal = types[i];
        PageEventType type = TYPES[typeOrdinal];
        int page = pages[i];
        long detail = details[i];
        boolean flagged = tracker.apply(typeOrdinal, page, generations[i], tenant, owners[i], detail);
        RecordChain c = common(chain.begin(TYPE_NAMES[typeOrdinal]), monoNanos[i], steps[i]);
        if (page >= 0) {
            c.field("page", page).field("gen", generations[i]);
        }
        if (tenant >= 0) {
            c.field("tenant", tenant);
        }
        owner(c, "", owners[i]);
        switch (type) {
            case WRITE, READ -> {
                c.rawField("slots", "[" + (detail >>> 32) + "," + (int) detail + "]");
                if (flagged) {
                    c.field("exposed", true);
                }
            }
            case CLAIM_TAKEN, CLAIM_DROPPED, CLAIM_FENCED -> {
                c.field("claim", Long.toHexString(detail));
                if (kinds[i] >= 0) {
                    c.field("kind", KIND_NAMES[kinds[i]]).field("peer", peers[i]);
                }
            }
            case RELEASE -> c.field("reason", name(RELEASE_NAMES, detail));
            case PROTECT_ISSUED, PROTECT_DONE, PROTECT_FAILED -> c.field("level", name(LEVEL_NAMES, detail));
            case VERIFY_FAILED -> {
                c.field("level", name(LEVEL_NAMES, detail)).field("alarm", true);
                int relTenant = tracker.releasedByTenant(page);
                long relOwner = tracker.releasedByOwner(page);
                if (relTenant >= 0) {
                    c.field("releasedByTenant", relTenant);
                }
                owner(c, "releasedBy", relOwner);
                alarms.increment();
                LOG.log(System.Logger.Level.ERROR, "pool " + scope.poolId() + " rank " + scope.rank() + ": page " + page
                        + " generation " + generations[i] + " was not zero after its scrub (released by tenant " + relTenant
                        + " " + Owners.describe(relOwner) + "); it is retired");
            }
            case SEAL, RECLAIM, SHRED -> c.field("keyEpoch", detail)
                    .field("keyId", (tenant >= 0 ? scope.tenantNames().apply(tenant) : "?") + "@" + detail);
            case RETIRE -> c.field("reason", name(RETIRE_NAMES, detail));
            case OWNERSHIP_TRANSFER -> owner(c, "from", detail);
            case READER_ADDED, READER_REMOVED -> c.field("reader", Owners.id(detail));
            default -> {
                if (type.isRejection()) {
                    c.field("handle", Long.toHexString(detail));
                }
            }
        }
        lines.add(c.end());
    }

    private void summary(int i) {
        ExposureTracker.RequestState r = tracker.finish(tenants[i], owners[i]);
        StringBuilder read = new StringBuilder("[");
        for (long pg : r.pagesRead) {
            read.append(read.length() > 1 ? "," : "").append('[').append(pg >>> 32).append(',').append((int) pg).append(']');
        }
        read.append(']');
        common(chain.begin("summary"), monoNanos[i], steps[i]).field("tenant", tenants[i]).field("req", Owners.id(owners[i]))
                .field("outcome", name(OUTCOME_NAMES, details[i])).rawField("pagesRead", read).field("exposed", r.exposed())
                .field("foreignSlotReads", r.foreignSlotReads).field("unwrittenSlotReads", r.unwrittenSlotReads)
                .rawField("sources", intList(r.sourceTenants)).rawField("sharedFrom", intList(r.sharedFrom))
                .field("rejections", r.rejections).field("verifyFailedPages", r.verifyFailedPages);
        lines.add(chain.end());
    }

    private static String intList(Iterable<Integer> values) {
        StringBuilder sb = new StringBuilder("[");
        for (int v : values) {
            sb.append(sb.length() > 1 ? "," : "").append(v);
        }
        return sb.append(']').toString();
    }

    private static String name(String[] names, long ordinal) {
        return ordinal >= 0 && ordinal < names.length ? names[(int) ordinal] : Long.toString(ordinal);
    }

    private static String[] names(Enum<?>[] values) {
        String[] n = new String[values.length];
        for (int i = 0; i < n.length; i++) {
            n[i] = values[i].name().toLowerCase(Locale.ROOT);
        }
        return n;
    }

    // ---------------------------------------------------------------- state and close

    /** Why the trail stopped writing, or null while it writes. */
    public String failure() {
        lock.lock();
        try {
            return failure;
        } finally {
            lock.unlock();
        }
    }

    public long recordsWritten() {
        return (long) written.count();
    }

    public long recordsDropped() {
        return (long) dropped.count();
    }

    public long alarms() {
        return (long) alarms.count();
    }

    /**
     * Writes what is buffered, a final signed checkpoint, and closes the sink. A pool this trail
     * listens to should be closed (or stop calling) first; later events are counted as dropped.
     */
    @Override
    public void close() {
        lock.lock();
        try {
            if (closed) {
                return;
            }
            flush0();
            if (failure == null) {
                write(true, true);
            }
            closed = true;
            try {
                config.sink().close();
            } catch (Exception e) {
                LOG.log(System.Logger.Level.ERROR, "closing audit sink " + config.sink().describe() + " failed: " + e);
            }
        } finally {
            lock.unlock();
        }
    }
}
