package dev.kvshield.audit;

import dev.kvshield.claims.ClaimKind;
import dev.kvshield.metrics.PoolMetrics;
import dev.kvshield.metrics.Rejection;
import java.util.Arrays;

/**
 * Delivers one pool's page events to its listeners and counts its rejections. A listener that
 * throws, an {@link Error} included, is counted and skipped: events never change what the pool
 * decides, and a call that emits mid-batch always completes its batch.
 *
 * <p>Implementation notes: Errors are caught too because the batch paths emit between their changes
 * (a hand-out's ALLOCATE events before its metrics, a boundary's PROTECT_DONE inside its loop); one
 * escaping there left the pool half-changed (a batch finished again at every later boundary, an owned
 * count never lowered), which is worse than a listener's lost event.
 *
 * <p>Guarded by the pool lock: the pool adds listeners and emits under it, so delivery reads the
 * listener array as a plain field. Delivery does not allocate.
 */
public final class PageEvents {
    private final PoolMetrics metrics;
    private PageEventListener[] listeners;
    private PageEventListener[] auditTrails = new PageEventListener[0];

    public PageEvents(PoolMetrics metrics, PageEventListener[] listeners) {
        this.metrics = metrics;
        this.listeners = listeners.clone();
    }

    public void add(PageEventListener listener, boolean isAuditTrail) {
        PageEventListener[] l = Arrays.copyOf(listeners, listeners.length + 1);
        l[l.length - 1] = listener;
        listeners = l;
        if (isAuditTrail) {
            auditTrails = Arrays.copyOf(auditTrails, auditTrails.length + 1);
            auditTrails[auditTrails.length - 1] = listener;
        }
    }

    /**
     * Null while an attached audit trail records; else why none does (none attached, or each one
     * closed or failed). The pool hands out pages to a tenant whose level requires a trail only on
     * null, checked at each hand-out: a trail that stops later stops those hand-outs with it.
     */
    public String auditGap() {
        if (auditTrails.length == 0) {
            return "no audit trail is attached (AuditTrail.attach)";
        }
        String why = null;
        for (PageEventListener trail : auditTrails) {
            String gap = trail.notRecording();
            if (gap == null) {
                return null;
            }
            why = why == null ? gap : why + "; " + gap;
        }
        return "its audit trail records nothing: " + why;
    }

    /** Whether anyone listens: a pass over pages that only emits events can be skipped without. */
    public boolean hasListeners() {
        return listeners.length > 0;
    }

    public void emit(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
        for (PageEventListener l : listeners) {
            try {
                l.onPageEvent(type, page, generation, tenant, owner, detail);
            } catch (RuntimeException | Error e) {
                metrics.listenerFailed();
            }
        }
    }

    public void emitClaim(PageEventType type, int page, int generation, int tenant, long owner, long claim, ClaimKind kind,
            long peer) {
        for (PageEventListener l : listeners) {
            try {
                l.onClaimEvent(type, page, generation, tenant, owner, claim, kind, peer);
            } catch (RuntimeException | Error e) {
                metrics.listenerFailed();
            }
        }
    }

    public void stepBoundary(long step) {
        for (PageEventListener l : listeners) {
            try {
                l.onStepBoundary(step);
            } catch (RuntimeException | Error e) {
                metrics.listenerFailed();
            }
        }
    }

    /**
     * Counts a rejection, emits its event and returns the exception for the caller to throw, so a
     * rejection reads {@code throw events.reject(...)}.
     */
    public <E extends RuntimeException> E reject(Rejection kind, PageEventType type, int page, int generation, int tenant,
            long owner, long detail, E exception) {
        metrics.rejected(kind);
        emit(type, page, generation, tenant, owner, detail);
        return exception;
    }
}
