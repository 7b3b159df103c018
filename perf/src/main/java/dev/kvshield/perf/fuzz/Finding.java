package dev.kvshield.perf.fuzz;

/**
 * Something a trace must never show.
 *
 * @param event index of the event being run when it was seen ({@code -1}: the end-of-trace drain)
 * @param request the request concerned, or -1
 */
public record Finding(Kind kind, int event, int request, String message) {
    public enum Kind {
        /** A request read a byte another request or tenant wrote. */
        LEAK,
        /** A request that reported success read back something other than its own content. */
        CORRUPT,
        /** A request's read-back differs from the same request run alone. */
        DIFF,
        /** A page handed out (or sitting free) held anything but zeros (or, reclaimed, its tenant's own data). */
        RESIDUE,
        /** The pool broke a rule: a fenced or stale use accepted, an unexpected exception, no recovery after the drain. */
        INVARIANT,
        /** A hostile batch (duplicate, foreign, released, never-minted, wrong-kind id) was accepted, or refused with another exception than the contract's. */
        REFUSAL,
        /** A refused call changed the pool (its state digest moved): not all or nothing. */
        ATOMICITY,
        /** The pool's holds on a page (content holds, claims, live leases) disagree with the reference model's. */
        HOLDS,
        /** An id handed out twice, out of order or past the counter's end (a wrap), or a page handed out at a generation it had before. */
        IDS
    }

    @Override
    public String toString() {
        return kind + " at " + (event < 0 ? "drain" : "event " + event) + (request >= 0 ? ", request " + request : "") + ": " + message;
    }
}
