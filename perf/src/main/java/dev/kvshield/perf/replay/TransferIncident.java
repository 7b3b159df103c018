package dev.kvshield.perf.replay;

import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;

/**
 * The shape of the transfer incidents: tenant A's request 1 ({@value #TOKENS} tokens) is handed
 * from prefill to decode by a DMA engine while tenant B's request 2 arrives and takes pages; the
 * subclass says what goes wrong half way.
 */
abstract class TransferIncident implements Incident {
    static final int TOKENS = 16;

    /**
     * Request 1's transfer under way: source and destination pages (and, under kvshield, its
     * handoff records; {@code destination} then holds the reservation's leases, which a commit
     * replaces with owner leases: read {@link ReplayRig#leasesOf} after it).
     */
    record Flight(long[] source, int[] sourcePages, long[] destination, int[] destinationPages, HandoffSender.Transfer transfer,
            Reservation reservation) {}

    @Override
    public IncidentResult replay(Level level, PageSealerFactory sealer) {
        try (ReplayRig rig = new ReplayRig(level, sealer)) {
            rig.request();
            rig.request();
            Flight f = start(rig);
            if (level == Level.STOCK) {
                replayStock(rig, f);
            } else {
                replayShielded(rig, f);
            }
            return rig.result(name());
        }
    }

    /** Computes request 1 on prefill and reserves its decode pages (stock: allocates; kvshield: begin and reserve). */
    private static Flight start(ReplayRig rig) {
        int a = ReplayRig.TENANT_A;
        long[] src = rig.compute(rig.prefill, a, 1, TOKENS);
        long[] dst = new long[rig.pagesFor(TOKENS)];
        HandoffSender.Transfer transfer = null;
        Reservation r = null;
        if (rig.level == Level.STOCK) {
            rig.decode.allocate(a, Owners.request(1), dst.length, dst, 0);
        } else {
            transfer = rig.sender.begin(a, 1, TOKENS, src, ReplayRig.DECODE_PEER);
            r = rig.receiver.reserve(a, 1, TOKENS, ReplayRig.PREFILL_PEER);
            dst = ReplayRig.leasesOf(r);
        }
        return new Flight(src, ReplayRig.pages(rig.prefill, src), dst, ReplayRig.pages(rig.decode, dst), transfer, r);
    }

    abstract void replayStock(ReplayRig rig, Flight f);

    abstract void replayShielded(ReplayRig rig, Flight f);
}
