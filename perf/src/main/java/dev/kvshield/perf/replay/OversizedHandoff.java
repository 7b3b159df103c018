package dev.kvshield.perf.replay;

import dev.kvshield.KvShieldException;
import dev.kvshield.audit.ReleaseReason;
import dev.kvshield.handoff.CommitResult;
import dev.kvshield.handoff.HandoffReceiver;
import dev.kvshield.handoff.HandoffSender;
import dev.kvshield.handoff.LocalTransport;
import dev.kvshield.handoff.Reservation;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.tenant.Owners;

/**
 * {@code oversized-handoff} (SGLang issue 30233 and the 2026 incident): a prompt longer than the
 * limit is rejected and shrunk to a one-token placeholder, but still enters the prefill→decode
 * handoff; decode reserves pages for the full prompt, receives one token of KV, and decodes over
 * what the reserved pages held before — another tenant's KV — returning it with a success status.
 *
 * <p>Script: tenant A's request 1 (28 tokens) is served and leaves its KV in the decode pages;
 * tenant B's request 2 is the offending one; requests 3 (A) and 4 (B) are ordinary. Under kvshield,
 * admission refuses request 2 before any page is reserved or any byte sent.
 *
 * <p>Subclasses (planted-bug twins in tests) may change how the decode side decides a commit and
 * replay a request whose transfer was cut short within the limit.
 */
public class OversizedHandoff implements Incident {
    private final int offendingTokens;
    private final int offendingSentTokens;

    public OversizedHandoff() {
        this(ReplayRig.LIMIT_TOKENS + 8, 1);
    }

    /**
     * @param offendingTokens the offending request's prompt (over the limit: the incident; within
     *     it: a transfer that was cut short)
     * @param offendingSentTokens tokens of it the prefill side actually sends
     */
    protected OversizedHandoff(int offendingTokens, int offendingSentTokens) {
        this.offendingTokens = offendingTokens;
        this.offendingSentTokens = offendingSentTokens;
    }

    @Override
    public String name() {
        return "oversized-handoff";
    }

    @Override
    public String description() {
        return "a request rejected for length still enters the prefill->decode handoff as a one-token placeholder;"
                + " decode reads the pages it reserved for the full prompt";
    }

    @Override
    public IncidentResult replay(Level level, PageSealerFactory sealer) {
        try (ReplayRig rig = new ReplayRig(level, sealer)) {
            handoff(rig, ReplayRig.TENANT_A, 1, 28, 28);
            rig.decode.endStep();
            handoff(rig, ReplayRig.TENANT_B, 2, offendingTokens, offendingSentTokens);
            rig.decode.endStep();
            handoff(rig, ReplayRig.TENANT_A, 3, 8, 8);
            handoff(rig, ReplayRig.TENANT_B, 4, 12, 12);
            return rig.result(name());
        }
    }

    private void handoff(ReplayRig rig, int tenant, long request, int promptTokens, int sentTokens) {
        rig.request();
        if (rig.level == Level.STOCK) {
            handoffStock(rig, tenant, request, promptTokens, sentTokens);
        } else {
            handoffShielded(rig, tenant, request, promptTokens, sentTokens);
        }
        rig.prefill.endStep();
    }

    /** SGLang's path: no admission before the handoff, no coverage check, decode reads what it reserved. */
    private static void handoffStock(ReplayRig rig, int tenant, long request, int promptTokens, int sentTokens) {
        int computed = promptTokens;
        if (promptTokens > ReplayRig.LIMIT_TOKENS) {
            rig.rejected(request, "prompt of " + promptTokens + " tokens exceeds the " + ReplayRig.LIMIT_TOKENS
                    + "-token limit; shrunk to a 1-token placeholder and still handed off");
            computed = 1;
        }
        long[] src = rig.compute(rig.prefill, tenant, request, computed);
        long[] dst = new long[rig.pagesFor(promptTokens)];
        rig.decode.allocate(tenant, Owners.request(request), dst.length, dst, 0);
        rig.dmaCopy(rig.prefillMemory, ReplayRig.pages(rig.prefill, src), rig.decodeMemory, ReplayRig.pages(rig.decode, dst), 0,
                Math.min(sentTokens, computed));
        rig.prefill.release(tenant, Owners.request(request), src, src.length, false);
        rig.respond(rig.decode, tenant, request, dst, promptTokens);
        rig.decode.release(tenant, Owners.request(request), dst, dst.length, false);
    }

    private void handoffShielded(ReplayRig rig, int tenant, long request, int promptTokens, int sentTokens) {
        long owner = Owners.request(request);
        HandoffSender.Transfer transfer;
        long[] src;
        try {
            rig.prefillPool().admit(promptTokens);
            src = rig.compute(rig.prefill, tenant, request, promptTokens);
            transfer = rig.sender.begin(tenant, request, promptTokens, src, ReplayRig.DECODE_PEER);
        } catch (KvShieldException e) {
            rig.rejectedWithError(request, e.getMessage());
            return;
        }
        HandoffReceiver receiver = rig.receiver;
        Reservation r;
        try {
            r = receiver.reserve(tenant, request, promptTokens, ReplayRig.PREFILL_PEER);
        } catch (KvShieldException e) {
            rig.sender.complete(transfer);
            rig.prefillPool().release(tenant, owner, src, 0, src.length, ReleaseReason.REJECTED);
            rig.rejectedWithError(request, e.getMessage());
            return;
        }
        LocalTransport.copy(rig.sender, transfer, receiver, r, rig.geometry, sentTokens);
        CommitResult c = commit(receiver, r, transfer.sentTokens());
        rig.sender.complete(transfer);
        receiver.acknowledge(r);
        rig.prefillPool().release(tenant, owner, src, 0, src.length, ReleaseReason.FINISHED);
        if (!c.committed()) {
            rig.error(request, c.message());
            return;
        }
        rig.respond(rig.decode, tenant, request, ReplayRig.leasesOf(r), promptTokens);
        receiver.finish(r);
    }

    /** The decode side decides the request on the coverage the sender published. */
    protected CommitResult commit(HandoffReceiver receiver, Reservation r, long coveredTokens) {
        return receiver.commit(r, coveredTokens);
    }
}
