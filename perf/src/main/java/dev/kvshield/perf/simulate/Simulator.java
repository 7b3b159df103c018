package dev.kvshield.perf.simulate;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.perf.workload.TraceRequest;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Runs a trace through a {@link ServingPool} the way a continuous-batching engine would, doing the
 * real memory work: each step admits arrivals, prefills waiting requests (allocating their pages,
 * writing canary KV for every prompt token, reading every page they attend over), decodes one token
 * for every running request (a new page when the last one is full, one token written, every
 * attended page read), releases finished and aborted requests, and ends the step on the pool.
 *
 * <p>Each tenant has one shared prefix, owned by the tenant's cache namespace and read by every
 * request that starts with it; at most {@code residentPrefixes} stay resident, and the least
 * recently used idle one is evicted (released) to make room. When the pool can reclaim
 * (ENCRYPT), an evicted prefix comes back by reclaim instead of recompute.
 *
 * <p>Admission reserves every page a request will need over its life, so decode never runs out.
 * A request that could never fit in the pool is rejected at arrival. With oracles on, every byte
 * read goes through the {@link LeakOracle}, every page handed out and every page whose seal
 * completed through the {@link ResidueOracle}, and before the trace every usable page of each pool
 * is cycled once (handed to one of the trace's tenants, written whole with that tenant's canary,
 * released), so every page the trace gets has been used before: a pool that hands out never-used
 * pages first (ENCRYPT keeps its sealed pages for reclaim until the free ones run out) would
 * otherwise reuse nothing on a pool larger than the trace, and its oracles would certify a reuse
 * path (clearing another tenant's sealed page at hand-out) they never saw. The cycle is not counted
 * as hand-outs and runs outside the steps.
 *
 * <p>Single-threaded; one instance runs once: {@link #run()}, or {@link #step()} until it answers
 * false and then {@link #finish()}.
 */
public final class Simulator {
    private final ServingPool pool;
    private final Handoff handoff;
    private final Trace trace;
    private final SimulationOptions options;
    private final PoolGeometry geometry;
    private final int pageSize;
    private final int buffers;
    private final Arena arena = Arena.ofConfined();
    private final PageScratch scratch;
    private final LeakOracle leaks;
    private final ResidueOracle residue;
    private final ResidueOracle prefillResidue;
    private final boolean[] handedBefore;
    private final boolean[] prefillHandedBefore;
    private final Prefix[] prefixes;

    private final ArrayDeque<Req> waiting = new ArrayDeque<>();
    private final List<Req> running = new ArrayList<>();
    private long reservedPages;
    private long step;
    private int completed;
    private int aborted;
    private int rejected;
    private int failed;
    private long handoffs;
    private long tokens;
    private long pagesHandedOut;
    private long pagesReused;
    private long prefixHits;
    private long prefixReclaims;
    private long prefixRecomputes;
    private int next;
    private long[] stepNanos = new long[1024];
    private long[] allocatorStepNanos = new long[1024];
    private long[] protectionStepNanos = new long[1024];

    private static final int ABSENT = 0;
    private static final int RESIDENT = 1;
    private static final int EVICTED_SEALED = 2;

    private static final class Prefix {
        final int tenant;
        final long owner;
        final long[] handles;
        int state = ABSENT;
        long writer;
        int readers;
        long lastUseStep;

        Prefix(int tenant, int pages) {
            this.tenant = tenant;
            this.owner = Owners.namespace(tenant);
            this.handles = new long[pages];
        }
    }

    private static final class Req {
        final TraceRequest trace;
        final long owner;
        final long[] pages;
        /** Leading tokens held in the tenant's shared prefix pages (0 for a handed-off request). */
        final int prefixTokens;
        int pageCount;
        int futurePages;
        int generated;
        Prefix prefix;
        /** The ids this request reads its prefix's pages through (its reader holds). */
        long[] prefixReads;
        boolean prefilledThisStep;

        Req(TraceRequest trace, int prefixTokens, int maxPages) {
            this.trace = trace;
            this.owner = Owners.request(trace.id());
            this.prefixTokens = prefixTokens;
            this.pages = new long[maxPages];
        }

        int ownTokens() {
            return trace.promptTokens() - prefixTokens + generated;
        }
    }

    /**
     * @param handoff moves requests flagged {@code handoff} from its prefill pool to {@code pool};
     *     null serves every request on {@code pool} alone
     */
    public Simulator(ServingPool pool, Handoff handoff, Trace trace, SimulationOptions options) {
        this.pool = pool;
        this.handoff = handoff;
        this.trace = trace;
        this.options = options;
        this.geometry = pool.memory().geometry();
        Canary.checkGeometry(geometry);
        this.pageSize = geometry.pageSizeTokens();
        this.buffers = geometry.bufferCount();
        this.scratch = new PageScratch(geometry, arena);
        this.leaks = options.oracles() ? new LeakOracle() : null;
        this.residue = options.oracles() ? new ResidueOracle(pool.memory()) : null;
        this.prefillResidue = options.oracles() && handoff != null ? new ResidueOracle(handoff.prefill().memory()) : null;
        this.handedBefore = new boolean[geometry.pageCount()];
        this.prefillHandedBefore = handoff == null ? null : new boolean[handoff.prefill().memory().geometry().pageCount()];
        int prefixPages = 0;
        for (TraceRequest r : trace.requests()) {
            prefixPages = Math.max(prefixPages, r.prefixTokens() / pageSize);
        }
        prefixes = new Prefix[trace.tenants()];
        for (int t = 0; t < prefixes.length; t++) {
            prefixes[t] = new Prefix(t, prefixPages);
        }
        pool.registerTenants(trace.tenants());
        if (handoff != null) {
            handoff.prefill().registerTenants(trace.tenants());
        }
        if (options.oracles()) {
            long firstCycleWriter = 0;
            for (TraceRequest r : trace.requests()) {
                firstCycleWriter = Math.max(firstCycleWriter, r.id() + 1L);
            }
            pool.watchSeals(residue::checkSealed);
            cycleEveryPage(pool, handedBefore, firstCycleWriter);
            if (handoff != null) {
                handoff.prefill().watchSeals(prefillResidue::checkSealed);
                cycleEveryPage(handoff.prefill(), prefillHandedBefore, firstCycleWriter);
            }
        }
    }

    /**
     * Hands every usable page of {@code target} out at once, in shares round-robin over the trace's
     * tenants (writer {@code firstWriter + tenant}, an id no trace request has), writes each page whole
     * with that writer's canary, then releases every share; marks the pages handed before. All are
     * held together: a pool that reuses its last freed pages first would hand one share out again.
     */
    private void cycleEveryPage(ServingPool target, boolean[] handed, long firstWriter) {
        int tenants = trace.tenants();
        int pages = target.available();
        int share = Math.ceilDiv(pages, tenants);
        long[] handles = new long[pages];
        for (int t = 0, from = 0; from < pages; t++, from += share) {
            int n = Math.min(share, pages - from);
            long writer = firstWriter + t;
            if (!target.allocate(t, Owners.request(writer), n, handles, from)) {
                throw new IllegalStateException("the " + target.level().label() + " pool could not give " + n + " of its " + pages
                        + " available pages to tenant " + t + " to cycle them before the oracle run");
            }
            for (int i = from; i < from + n; i++) {
                handed[target.pageOf(handles[i])] = true;
                writeSlots(target, t, Owners.request(writer), writer, handles[i], 0, pageSize, 0);
            }
        }
        for (int t = 0, from = 0; from < pages; t++, from += share) {
            target.release(t, Owners.request(firstWriter + t), Arrays.copyOfRange(handles, from, Math.min(from + share, pages)),
                    Math.min(share, pages - from), false);
        }
        target.endStep();
    }

    private int pagesFor(int tokenCount) {
        return (tokenCount + pageSize - 1) / pageSize;
    }

    /** Runs the whole trace; every request ends completed, aborted or rejected. */
    public SimulationResult run() {
        while (step()) {
            // one scheduler step per iteration
        }
        return finish();
    }

    /**
     * Runs one scheduler step: admits arrivals, prefills, decodes, ends the step on the pools.
     * Times the step and, within it, the allocator's calls (see {@link ServingPool#allocatorNanos()}).
     * Callers may interleave the steps of several simulators (paired measurement).
     *
     * @return false, having run nothing, once every request has ended
     */
    public boolean step() {
        if (done()) {
            return false;
        }
        List<TraceRequest> requests = trace.requests();
        long stepStart = System.nanoTime();
        long allocatorStart = allocatorNanos();
        double protectionStart = protectionSeconds();
        while (next < requests.size() && requests.get(next).arrivalStep() <= step) {
            arrive(requests.get(next++));
        }
        prefillWaiting();
        decodeRunning();
        pool.endStep();
        if (handoff != null) {
            handoff.prefill().endStep();
        }
        long stepEnd = System.nanoTime();
        if (step == stepNanos.length) {
            stepNanos = Arrays.copyOf(stepNanos, stepNanos.length * 2);
            allocatorStepNanos = Arrays.copyOf(allocatorStepNanos, stepNanos.length);
            protectionStepNanos = Arrays.copyOf(protectionStepNanos, stepNanos.length);
        }
        int s = (int) step++;
        stepNanos[s] = stepEnd - stepStart;
        allocatorStepNanos[s] = allocatorNanos() - allocatorStart;
        protectionStepNanos[s] = Math.round((protectionSeconds() - protectionStart) * 1e9);
        return true;
    }

    private boolean done() {
        return next == trace.requests().size() && waiting.isEmpty() && running.isEmpty();
    }

    private long allocatorNanos() {
        return handoff == null ? pool.allocatorNanos()
                : pool.allocatorNanos() + handoff.prefill().allocatorNanos() + handoff.allocatorNanos();
    }

    private double protectionSeconds() {
        return handoff == null ? pool.protectionSeconds() : pool.protectionSeconds() + handoff.prefill().protectionSeconds();
    }

    /**
     * Ends the run after the last {@link #step()}: releases the resident prefixes (untimed) and
     * returns what the run produced; the serving time is the sum of the step times.
     *
     * @throws IllegalStateException if requests are still waiting or running
     */
    public SimulationResult finish() {
        if (!done()) {
            throw new IllegalStateException("finish() called at step " + step + " with " + (trace.requests().size() - next)
                    + " requests yet to arrive, " + waiting.size() + " waiting and " + running.size() + " running");
        }
        List<TraceRequest> requests = trace.requests();
        long[] steps = Arrays.copyOf(stepNanos, (int) step);
        long wall = 0;
        for (long n : steps) {
            wall += n;
        }
        releaseAllPrefixes();
        pool.endStep();
        SimulationResult result = new SimulationResult(pool.level(), requests.size(), completed, aborted, rejected, failed, handoffs,
                tokens, step, wall, steps, Arrays.copyOf(allocatorStepNanos, (int) step),
                Arrays.copyOf(protectionStepNanos, (int) step), pagesHandedOut, pagesReused, prefixHits, prefixReclaims,
                prefixRecomputes, pool.bytesProtected(), pool.protectionSeconds(), leaks == null ? -1 : leaks.leakedBytes(),
                leaks == null ? -1 : leaks.leakedRequests(), leaks == null ? java.util.Map.of() : leaks.flows(),
                leaks == null ? null : leaks.firstLeak(),
                residue == null ? -1 : residue.dirtyPages() + residue.plaintextSealedPages() + residueOf(prefillResidue, false),
                residue == null ? -1 : residue.foreignResiduePages() + residueOf(prefillResidue, true),
                residue == null ? -1
                        : residue.plaintextSealedPages() + (prefillResidue == null ? 0 : prefillResidue.plaintextSealedPages()));
        arena.close();
        if (residue != null) {
            residue.close();
        }
        if (prefillResidue != null) {
            prefillResidue.close();
        }
        return result;
    }

    /** A prefill pool's residue: dirty hand-outs and plaintext sealed pages, or (foreign) the foreign hand-outs. */
    private static long residueOf(ResidueOracle oracle, boolean foreign) {
        return oracle == null ? 0 : foreign ? oracle.foreignResiduePages() : oracle.dirtyPages() + oracle.plaintextSealedPages();
    }

    private void arrive(TraceRequest r) {
        boolean handedOff = r.handoff() && handoff != null;
        int prefix = handedOff ? 0 : r.prefixTokens();
        int ownPages = pagesFor(r.promptTokens() - prefix + r.outputTokens());
        if (ownPages + prefix / pageSize > geometry.usablePages()
                || handedOff && pagesFor(r.promptTokens()) > handoff.prefill().memory().geometry().usablePages()) {
            rejected++;
            return;
        }
        waiting.add(new Req(r, prefix, ownPages));
    }

    // ---------------------------------------------------------------- prefill

    private void prefillWaiting() {
        int budget = options.prefillTokensPerStep();
        boolean first = true;
        while (!waiting.isEmpty() && running.size() < options.maxRunning()) {
            Req req = waiting.peek();
            Prefix prefix = req.prefixTokens > 0 ? prefixes[req.trace.tenant()] : null;
            int compute = req.trace.promptTokens() - (prefix != null && prefix.state == RESIDENT ? req.prefixTokens : 0);
            if (!first && compute > budget) {
                return;
            }
            if (!admit(req, prefix)) {
                return;
            }
            waiting.poll();
            budget -= compute;
            first = false;
            if (prefill(req, prefix)) {
                running.add(req);
            }
        }
    }

    /** Makes room for the request's lifetime pages (evicting idle prefixes), or answers false. */
    private boolean admit(Req req, Prefix prefix) {
        int prefixNeed = prefix != null && prefix.state != RESIDENT ? prefix.handles.length : 0;
        int need = req.pages.length + prefixNeed;
        while (pool.available() - reservedPages < need) {
            if (!evictIdlePrefix(prefix)) {
                return false;
            }
        }
        return true;
    }

    private boolean evictIdlePrefix(Prefix keep) {
        Prefix victim = null;
        for (Prefix p : prefixes) {
            if (p != keep && p.state == RESIDENT && p.readers == 0 && (victim == null || p.lastUseStep < victim.lastUseStep)) {
                victim = p;
            }
        }
        if (victim == null) {
            return false;
        }
        pool.release(victim.tenant, victim.owner, victim.handles, victim.handles.length, false);
        victim.state = pool.reclaimable(victim.tenant) ? EVICTED_SEALED : ABSENT;
        return true;
    }

    private int residentPrefixes() {
        int n = 0;
        for (Prefix p : prefixes) {
            if (p.state == RESIDENT) {
                n++;
            }
        }
        return n;
    }

    /** Prefills a request (here, or on the prefill pool and hands it off); false if the handoff was refused. */
    private boolean prefill(Req req, Prefix prefix) {
        int tenant = req.trace.tenant();
        if (prefix != null) {
            attachPrefix(req, prefix);
        }
        int own = req.trace.promptTokens() - req.prefixTokens;
        int pages = pagesFor(own);
        if (req.trace.handoff() && handoff != null) {
            if (!prefillAndHandOff(req, pages)) {
                failed++;
                return false;
            }
        } else {
            allocateInto(tenant, req.owner, pages, req.pages, 0);
            for (int p = 0; p < pages; p++) {
                int slots = Math.min(pageSize, own - p * pageSize);
                writeSlots(pool, tenant, req.owner, req.trace.id(), req.pages[p], 0, slots, req.prefixTokens + p * pageSize);
            }
        }
        req.pageCount = pages;
        req.futurePages = req.pages.length - pages;
        reservedPages += req.futurePages;
        tokens += req.trace.promptTokens();
        attend(req);
        req.prefilledThisStep = true;
        return true;
    }

    /** Computes the whole prompt on the prefill pool (attending over it there), then hands it to decode pages. */
    private boolean prefillAndHandOff(Req req, int pages) {
        int tenant = req.trace.tenant();
        int prompt = req.trace.promptTokens();
        ServingPool source = handoff.prefill();
        long[] src = new long[pages];
        if (!source.allocate(tenant, req.owner, pages, src, 0)) {
            throw new IllegalStateException("the prefill pool could not give " + pages + " pages for request " + req.trace.id());
        }
        for (int p = 0; p < pages; p++) {
            int page = source.pageOf(src[p]);
            pagesHandedOut++;
            if (prefillHandedBefore[page]) {
                pagesReused++;
            }
            prefillHandedBefore[page] = true;
            if (prefillResidue != null) {
                prefillResidue.checkHandOut(page, tenant, false);
            }
            int slots = Math.min(pageSize, prompt - p * pageSize);
            writeSlots(source, tenant, req.owner, req.trace.id(), src[p], 0, slots, p * pageSize);
        }
        for (int p = 0; p < pages; p++) {
            readPage(source, tenant, req.owner, src[p], Math.min(pageSize, prompt - p * pageSize), tenant, req.trace.id());
        }
        handoffs++;
        return handoff.transfer(tenant, req.trace.id(), src, prompt, req.pages, h -> handedOut(h, tenant, false));
    }

    private void attachPrefix(Req req, Prefix prefix) {
        int tenant = prefix.tenant;
        if (prefix.state == RESIDENT) {
            prefixHits++;
        } else {
            while (residentPrefixes() >= Math.max(1, options.residentPrefixes()) && evictIdlePrefix(prefix)) {
                // evicted the least recently used idle prefix
            }
            boolean restored = prefix.state == EVICTED_SEALED && reclaimPrefix(prefix);
            if (!restored) {
                prefixRecomputes++;
                allocateInto(tenant, prefix.owner, prefix.handles.length, prefix.handles, 0);
                prefix.writer = req.trace.id();
                for (int p = 0; p < prefix.handles.length; p++) {
                    writeSlots(pool, tenant, prefix.owner, prefix.writer, prefix.handles[p], 0, pageSize, p * pageSize);
                }
            }
            prefix.state = RESIDENT;
        }
        req.prefixReads = new long[prefix.handles.length];
        pool.addReaders(tenant, prefix.owner, prefix.handles, prefix.handles.length, req.owner, req.prefixReads);
        prefix.readers++;
        prefix.lastUseStep = step;
        req.prefix = prefix;
    }

    /** Reclaims every page of a sealed prefix; on a partial hit gives back what it got and answers false. */
    private boolean reclaimPrefix(Prefix prefix) {
        int n = prefix.handles.length;
        long[] out = new long[n];
        int hits = pool.reclaim(prefix.tenant, prefix.owner, prefix.handles, n, out);
        if (hits == n) {
            for (int i = 0; i < n; i++) {
                handedOut(out[i], prefix.tenant, true);
            }
            System.arraycopy(out, 0, prefix.handles, 0, n);
            prefixReclaims += n;
            return true;
        }
        int k = 0;
        for (long h : out) {
            if (h != 0) {
                out[k++] = h;
            }
        }
        if (k > 0) {
            pool.release(prefix.tenant, prefix.owner, out, k, false);
        }
        prefix.state = ABSENT;
        return false;
    }

    private void allocateInto(int tenant, long owner, int count, long[] dst, int offset) {
        if (count == 0) {
            return;
        }
        if (!pool.allocate(tenant, owner, count, dst, offset)) {
            throw new IllegalStateException("the simulation reserved " + count + " pages for tenant " + tenant + " "
                    + Owners.describe(owner) + " but the " + pool.level().label() + " pool could not give them (available "
                    + pool.available() + ", reserved " + reservedPages + ")");
        }
        for (int i = 0; i < count; i++) {
            handedOut(dst[offset + i], tenant, false);
        }
    }

    private void handedOut(long handle, int tenant, boolean reclaimed) {
        int page = pool.pageOf(handle);
        pagesHandedOut++;
        if (handedBefore[page]) {
            pagesReused++;
        }
        handedBefore[page] = true;
        if (residue != null) {
            residue.checkHandOut(page, tenant, reclaimed);
        }
    }

    private void writeSlots(ServingPool target, int tenant, long owner, long writer, long handle, int slot, int count,
            int firstPosition) {
        MemorySegment[] src = scratch.slots(count);
        for (int b = 0; b < buffers; b++) {
            Canary.fill(src[b], tenant, writer, firstPosition, count, b, geometry.bytesPerToken(b));
        }
        target.write(tenant, owner, handle, slot, src);
    }

    /** Reads every slot the request attends over: its prefix pages, then its own pages. */
    private void attend(Req req) {
        int tenant = req.trace.tenant();
        Prefix prefix = req.prefix;
        if (prefix != null) {
            for (long h : req.prefixReads) {
                readPage(pool, tenant, req.owner, h, pageSize, prefix.tenant, prefix.writer);
            }
        }
        int own = req.ownTokens();
        for (int p = 0; p < req.pageCount; p++) {
            readPage(pool, tenant, req.owner, req.pages[p], Math.min(pageSize, own - p * pageSize), tenant, req.trace.id());
        }
    }

    private void readPage(ServingPool source, int tenant, long reader, long handle, int slots, int writerTenant, long writer) {
        MemorySegment[] dst = scratch.slots(slots);
        source.read(tenant, reader, handle, 0, dst);
        if (leaks != null) {
            for (int b = 0; b < buffers; b++) {
                leaks.check(dst[b], slots, b, geometry.bytesPerToken(b), tenant, Owners.id(reader), writerTenant, writer);
            }
        }
    }

    // ---------------------------------------------------------------- decode

    private void decodeRunning() {
        for (int i = 0; i < running.size(); i++) {
            Req req = running.get(i);
            if (req.prefilledThisStep) {
                req.prefilledThisStep = false;
                continue;
            }
            if (req.trace.aborts() && req.generated == req.trace.abortAfterTokens()) {
                finish(req, true);
                running.remove(i--);
                continue;
            }
            decodeOne(req);
            if (req.generated == req.trace.outputTokens()) {
                finish(req, false);
                running.remove(i--);
            }
        }
    }

    private void decodeOne(Req req) {
        int tenant = req.trace.tenant();
        int own = req.ownTokens();
        if (own == req.pageCount * pageSize) {
            allocateInto(tenant, req.owner, 1, req.pages, req.pageCount);
            req.pageCount++;
            req.futurePages--;
            reservedPages--;
        }
        int page = own / pageSize;
        writeSlots(pool, tenant, req.owner, req.trace.id(), req.pages[page], own % pageSize, 1, req.prefixTokens + own);
        req.generated++;
        tokens++;
        attend(req);
    }

    private void finish(Req req, boolean abort) {
        int tenant = req.trace.tenant();
        pool.release(tenant, req.owner, req.pages, req.pageCount, abort);
        reservedPages -= req.futurePages;
        req.futurePages = 0;
        Prefix prefix = req.prefix;
        if (prefix != null) {
            pool.removeReaders(tenant, req.owner, req.prefixReads, req.prefixReads.length);
            prefix.readers--;
            prefix.lastUseStep = step;
        }
        if (abort) {
            aborted++;
        } else {
            completed++;
        }
    }

    private void releaseAllPrefixes() {
        for (Prefix p : prefixes) {
            if (p.state == RESIDENT) {
                pool.release(p.tenant, p.owner, p.handles, p.handles.length, false);
                p.state = ABSENT;
            }
        }
    }
}
