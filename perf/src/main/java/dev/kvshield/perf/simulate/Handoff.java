package dev.kvshield.perf.simulate;

import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.tenant.Owners;
import java.lang.foreign.Arena;
import java.util.function.LongConsumer;

/**
 * Moves a prefilled request's KV from a prefill pool to a decode pool (disaggregated serving), the
 * way each kind of pool does it: {@link #stock} copies into pages decode allocated, with no
 * checks; {@link #shielded} runs kvshield's handoff (admission, reader claims on the source,
 * reservation with writer claims, copy through the claims, commit on published coverage, the
 * transport's acknowledgement). Single-threaded; close it to free its scratch.
 */
public abstract class Handoff implements AutoCloseable {
    static final long PREFILL_PEER = 1;
    static final long DECODE_PEER = 2;

    final ServingPool prefill;
    final ServingPool decode;
    final PoolGeometry geometry;
    private final Arena arena = Arena.ofConfined();
    final PageScratch scratch;

    Handoff(ServingPool prefill, ServingPool decode) {
        this.prefill = prefill;
        this.decode = decode;
        this.geometry = decode.memory().geometry();
        if (!geometry.equals(prefill.memory().geometry())) {
            throw new IllegalArgumentException("prefill and decode geometries differ: " + prefill.memory().geometry() + " vs " + geometry);
        }
        scratch = new PageScratch(geometry, arena);
    }

    /** The prefill-side pool requests are computed on before the handoff. */
    public ServingPool prefill() {
        return prefill;
    }

    /**
     * Hands a request's first {@code tokens} tokens, held in {@code source} pages of the prefill pool,
     * to decode pages written into {@code out}; releases the source pages.
     *
     * @param onReserved sees each decode page's id as it is handed out, before any byte lands
     *     (the residue oracle)
     * @return true if decode may serve the request from {@code out}; false if the handoff was
     *     refused (the request fails; nothing is left reserved)
     */
    public abstract boolean transfer(int tenant, long request, long[] source, int tokens, long[] out, LongConsumer onReserved);

    /**
     * Nanoseconds spent so far in handoff control the pools' own {@link ServingPool#allocatorNanos()}
     * do not see (kvshield's sender and receiver calls); the copy of KV bytes is excluded.
     */
    public abstract long allocatorNanos();

    /** The handoff a level's pools use. */
    public static Handoff of(ServingPool prefill, ServingPool decode) {
        if (prefill instanceof ShieldedPool p && decode instanceof ShieldedPool d) {
            return new Shielded(p, d);
        }
        if (prefill instanceof StockPool && decode instanceof StockPool) {
            return new Stock(prefill, decode);
        }
        throw new IllegalArgumentException("prefill and decode pools must both be stock or both kvshield: " + prefill.level() + ", "
                + decode.level());
    }

    @Override
    public void close() {
        arena.close();
    }

    /** SGLang's path: decode allocates, the transport copies, nothing is checked. */
    static final class Stock extends Handoff {
        Stock(ServingPool prefill, ServingPool decode) {
            super(prefill, decode);
        }

        @Override
        public boolean transfer(int tenant, long request, long[] source, int tokens, long[] out, LongConsumer onReserved) {
            int pageSize = geometry.pageSizeTokens();
            int pages = (tokens + pageSize - 1) / pageSize;
            if (!decode.allocate(tenant, Owners.request(request), pages, out, 0)) {
                throw new IllegalStateException("decode pool could not give " + pages + " reserved pages");
            }
            for (int p = 0; p < pages; p++) {
                onReserved.accept(out[p]);
            }
            PageMemory from = prefill.memory();
            PageMemory to = decode.memory();
            for (int p = 0; p < pages; p++) {
                int n = Math.min(pageSize, tokens - p * pageSize);
                for (int b = 0; b < geometry.bufferCount(); b++) {
                    from.read(prefill.pageOf(source[p]), b, 0, scratch.slots(n)[b]);
                    to.write(decode.pageOf(out[p]), b, 0, scratch.slots(n)[b]);
                }
            }
            prefill.release(tenant, Owners.request(request), source, pages, false);
            return true;
        }

        /** Its allocate and release go through the pools, which time them. */
        @Override
        public long allocatorNanos() {
            return 0;
        }
    }

    /** kvshield's handoff, with the transport a copy through the sender's and receiver's claims. */
    static final class Shielded extends Handoff {
        private final HandoffSender sender;
        private final HandoffReceiver receiver;
        private long allocatorNanos;

        Shielded(ShieldedPool prefill, ShieldedPool decode) {
            super(prefill, decode);
            sender = new HandoffSender(prefill.pool());
            receiver = new HandoffReceiver(decode.pool(), alarm -> {
                throw new IllegalStateException("the simulation never lets a transfer expire: " + alarm);
            });
            sender.handshake(DECODE_PEER, receiver.effectiveLimitTokens());
            receiver.handshake(PREFILL_PEER, sender.effectiveLimitTokens());
        }

        @Override
        public boolean transfer(int tenant, long request, long[] source, int tokens, long[] out, LongConsumer onReserved) {
            int pageSize = geometry.pageSizeTokens();
            int pages = (tokens + pageSize - 1) / pageSize;
            long t0 = System.nanoTime();
            HandoffSender.Transfer t = sender.begin(tenant, request, tokens, java.util.Arrays.copyOf(source, pages), DECODE_PEER);
            Reservation r = receiver.reserve(tenant, request, tokens, PREFILL_PEER);
            if (r == null) {
                sender.complete(t);
                throw new IllegalStateException("decode pool could not reserve " + pages + " pages: "
                        + ((ShieldedPool) decode).pool().lastShortfall());
            }
            allocatorNanos += System.nanoTime() - t0;
            for (int p = 0; p < pages; p++) {
                onReserved.accept(r.lease(p));
            }
            for (int p = 0; p < pages; p++) {
                int n = Math.min(pageSize, tokens - p * pageSize);
                for (int b = 0; b < geometry.bufferCount(); b++) {
                    sender.read(t, p, b, 0, scratch.slots(n)[b]);
                    receiver.write(r, p, b, 0, scratch.slots(n)[b]);
                }
            }
            long t1 = System.nanoTime();
            sender.markSent(t, tokens);
            CommitResult c = receiver.commit(r, t.sentTokens());
            sender.complete(t);
            receiver.acknowledge(r);
            allocatorNanos += System.nanoTime() - t1;
            prefill.release(tenant, Owners.request(request), source, pages, false);
            if (!c.committed()) {
                return false;
            }
            for (int p = 0; p < pages; p++) {
                out[p] = r.lease(p);
            }
            return true;
        }

        @Override
        public long allocatorNanos() {
            return allocatorNanos;
        }
    }
}
