package dev.kvshield.perf.replay;

import dev.kvshield.KvShieldException;
import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.simulate.Canary;
import dev.kvshield.perf.simulate.LeakOracle;
import dev.kvshield.perf.simulate.PoolFactory;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.PageScratch;
import dev.kvshield.perf.simulate.ServingPool;
import dev.kvshield.perf.simulate.ShieldedPool;
import dev.kvshield.perf.simulate.StockPool;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The stage every incident is replayed on: a prefill pool and a decode pool of the same small
 * geometry over their own memory, both of one level (stock pools, or kvshield pools with the
 * handoff sender and receiver after their limit handshake), two tenants, canary KV, the leak
 * oracle and the request tally.
 *
 * <p>The transport is modelled as a DMA engine: {@link #dmaCopy} moves bytes between physical pages
 * without asking either pool, as RDMA does; what kvshield controls is when those pages may change
 * hands (claims), and what the receiving side believes (coverage, written extent).
 *
 * <p>Single-threaded; close it to free everything.
 */
public final class ReplayRig implements AutoCloseable {
    /** The advertised (and effective) request limit of both sides, tokens. */
    public static final int LIMIT_TOKENS = 32;
    public static final int TENANT_A = 0;
    public static final int TENANT_B = 1;
    static final long PREFILL_PEER = 101;
    static final long DECODE_PEER = 202;

    final Level level;
    final PoolGeometry geometry = PoolGeometry.builder().mha(2, 1, 8, 2).pageSizeTokens(4).pageCount(24).build();
    final PageMemory prefillMemory;
    final PageMemory decodeMemory;
    final ServingPool prefill;
    final ServingPool decode;
    /** kvshield only (null under stock). */
    final HandoffSender sender;
    /** kvshield only (null under stock). */
    final HandoffReceiver receiver;
    final LeakOracle oracle = new LeakOracle();
    final List<String> alarms = new ArrayList<>();
    private final Arena arena = Arena.ofConfined();
    private final PageScratch scratch;
    private final Map<String, String> outcomes = new LinkedHashMap<>();
    private int requests;
    private int completed;
    private int rejected;
    private int errors;
    private int leakedResponses;

    ReplayRig(Level level, PageSealerFactory sealer) {
        this.level = level;
        this.prefillMemory = OffHeapPageMemory.allocate(geometry);
        this.decodeMemory = OffHeapPageMemory.allocate(geometry);
        if (level == Level.STOCK) {
            prefill = new StockPool(prefillMemory);
            decode = new StockPool(decodeMemory);
            sender = null;
            receiver = null;
        } else {
            KvPagePool p = KvPagePool.create(config(level, "prefill", sealer), prefillMemory);
            KvPagePool d = KvPagePool.create(config(level, "decode", sealer), decodeMemory);
            prefill = new ShieldedPool(level, p, attachments(p));
            decode = new ShieldedPool(level, d, attachments(d));
            sender = new HandoffSender(p);
            receiver = new HandoffReceiver(d, alarms::add);
            sender.handshake(DECODE_PEER, receiver.effectiveLimitTokens());
            receiver.handshake(PREFILL_PEER, sender.effectiveLimitTokens());
        }
        prefill.registerTenants(2);
        decode.registerTenants(2);
        scratch = new PageScratch(geometry, arena);
    }

    private PoolConfig config(Level level, String side, PageSealerFactory sealer) {
        if (level.protection().needsKeySource() && sealer == null) {
            throw new IllegalArgumentException("level encrypt needs a key source (the tenant-keys module)");
        }
        PoolConfig.Builder b = PoolConfig.builder(geometry).level(level.protection()).poolId("replay-" + side)
                .admission(new AdmissionPolicy(LIMIT_TOKENS, 0, false));
        if (sealer != null) {
            b.sealer(sealer);
        }
        return b.build();
    }

    /** COMPLIANCE hands out pages only under an audit trail: the same trail the report's pools get. */
    private AutoCloseable attachments(KvPagePool pool) {
        return level.protection().requiresAuditTrail() ? PoolFactory.attachAuditTrail(pool) : () -> { };
    }

    KvPagePool prefillPool() {
        return ((ShieldedPool) prefill).pool();
    }

    KvPagePool decodePool() {
        return ((ShieldedPool) decode).pool();
    }

    int pagesFor(int tokens) {
        return (tokens + geometry.pageSizeTokens() - 1) / geometry.pageSizeTokens();
    }

    /** Counts a request of the scenario. */
    void request() {
        requests++;
    }

    /** Allocates pages for {@code tokens} and writes the request's canary into them (a prefill). */
    long[] compute(ServingPool pool, int tenant, long request, int tokens) {
        long[] handles = new long[pagesFor(tokens)];
        if (!pool.allocate(tenant, Owners.request(request), handles.length, handles, 0)) {
            throw new IllegalStateException("the replay pool has no room for request " + request + " (" + tokens + " tokens)");
        }
        writeTokens(pool, tenant, request, handles, 0, tokens);
        return handles;
    }

    /** Writes the request's canary for tokens {@code [from, to)} through the pool. */
    void writeTokens(ServingPool pool, int tenant, long request, long[] handles, int from, int to) {
        int pageSize = geometry.pageSizeTokens();
        for (int token = from; token < to; ) {
            int slot = token % pageSize;
            int n = Math.min(pageSize - slot, to - token);
            MemorySegment[] src = scratch.slots(n);
            for (int b = 0; b < geometry.bufferCount(); b++) {
                Canary.fill(src[b], tenant, request, token, n, b, geometry.bytesPerToken(b));
            }
            pool.write(tenant, Owners.request(request), handles[token / pageSize], slot, src);
            token += n;
        }
    }

    /**
     * A DMA transfer: copies tokens {@code [from, to)} of every buffer from physical source pages to
     * physical destination pages, asking neither pool.
     */
    void dmaCopy(PageMemory src, int[] srcPages, PageMemory dst, int[] dstPages, int from, int to) {
        int pageSize = geometry.pageSizeTokens();
        for (int token = from; token < to; ) {
            int slot = token % pageSize;
            int n = Math.min(pageSize - slot, to - token);
            MemorySegment[] slices = scratch.slots(n);
            for (int b = 0; b < geometry.bufferCount(); b++) {
                src.read(srcPages[token / pageSize], b, slot, slices[b]);
                dst.write(dstPages[token / pageSize], b, slot, slices[b]);
            }
            token += n;
        }
    }

    /**
     * The request's response: reads tokens {@code [0, tokens)} of its pages through the pool (the
     * decode step attending over its sequence) with the leak oracle on every byte. A guard that
     * refuses the read turns the response into an error.
     *
     * @return true if the response was served
     */
    boolean respond(ServingPool pool, int tenant, long request, long[] handles, int tokens) {
        long leaked = 0;
        int pageSize = geometry.pageSizeTokens();
        try {
            for (int p = 0; p * pageSize < tokens; p++) {
                int n = Math.min(pageSize, tokens - p * pageSize);
                MemorySegment[] dst = scratch.slots(n);
                pool.read(tenant, Owners.request(request), handles[p], 0, dst);
                for (int b = 0; b < geometry.bufferCount(); b++) {
                    leaked += oracle.check(dst[b], n, b, geometry.bytesPerToken(b), tenant, request, tenant, request);
                }
            }
        } catch (KvShieldException e) {
            error(request, "read refused: " + e.getMessage());
            return false;
        }
        completed++;
        if (leaked > 0) {
            leakedResponses++;
            outcomes.put("request " + request, "completed with " + leaked + " leaked bytes");
        } else {
            outcomes.put("request " + request, "completed");
        }
        return true;
    }

    void rejected(long request, String why) {
        rejected++;
        outcomes.put("request " + request, "rejected: " + why);
    }

    /** A request that was rejected ends with an error status (kvshield) — counted once in each tally. */
    void rejectedWithError(long request, String why) {
        rejected++;
        errors++;
        outcomes.put("request " + request, "rejected with an error: " + why);
    }

    void error(long request, String why) {
        errors++;
        outcomes.put("request " + request, "error: " + why);
    }

    IncidentResult result(String incident) {
        return new IncidentResult(incident, level, requests, completed, rejected, errors, leakedResponses, oracle.leakedBytes(),
                oracle.firstLeak(), outcomes);
    }

    /** A reservation's current leases: its reservations before commit, the request's owner leases after. */
    static long[] leasesOf(Reservation r) {
        long[] leases = new long[r.pageCount()];
        for (int i = 0; i < leases.length; i++) {
            leases[i] = r.lease(i);
        }
        return leases;
    }

    static int[] pages(ServingPool pool, long[] handles) {
        int[] p = new int[handles.length];
        for (int i = 0; i < p.length; i++) {
            p[i] = pool.pageOf(handles[i]);
        }
        return p;
    }

    @Override
    public void close() {
        prefill.close();
        decode.close();
        prefillMemory.close();
        decodeMemory.close();
        arena.close();
    }
}
