package dev.kvshield.metrics;

/**
 * Every metric a pool publishes. All carry the tags {@code pool} (pool id) and {@code rank}
 * (tensor-parallel rank).
 *
 * <table>
 *   <caption>metrics</caption>
 *   <tr><th>name</th><th>type</th><th>unit</th><th>extra tags</th><th>meaning</th></tr>
 *   <tr><td>{@value #PAGES}</td><td>gauge</td><td>pages</td><td>state=free|sealed|owned|quarantined|retired|claimed</td><td>pages by life-cycle state ({@code claimed}: pages with live or revoked claims)</td></tr>
 *   <tr><td>{@value #PAGES_ALLOCATED}</td><td>counter</td><td>pages</td><td></td><td>pages handed out (allocate and reclaim)</td></tr>
 *   <tr><td>{@value #PAGES_RELEASED}</td><td>counter</td><td>pages</td><td></td><td>pages released by their owners</td></tr>
 *   <tr><td>{@value #ALLOCATIONS_NONE}</td><td>counter</td><td>calls</td><td></td><td>allocations answered "none" (pool or quota exhausted)</td></tr>
 *   <tr><td>{@value #PAGES_PROTECTED}</td><td>counter</td><td>pages</td><td>level</td><td>pages whose protection was confirmed</td></tr>
 *   <tr><td>{@value #BYTES_PROTECTED}</td><td>counter</td><td>bytes</td><td>level</td><td>page bytes scrubbed, sealed or verified</td></tr>
 *   <tr><td>{@value #PROTECTION_TIME}</td><td>timer</td><td>seconds</td><td>level</td><td>time spent in backend protection calls</td></tr>
 *   <tr><td>{@value #REJECTIONS}</td><td>counter</td><td>calls</td><td>reason=stale|double_free|foreign|invalid|revoked_claim|unknown_tenant</td><td>misuse rejected</td></tr>
 *   <tr><td>{@value #READ_BEFORE_WRITE}</td><td>counter</td><td>calls</td><td></td><td>reads of slots not written in the current generation</td></tr>
 *   <tr><td>{@value #PROTECTION_FAILURES}</td><td>counter</td><td>pages</td><td></td><td>pages whose protection failed (kept out of FREE)</td></tr>
 *   <tr><td>{@value #VERIFY_FAILURES}</td><td>counter</td><td>pages</td><td></td><td>pages that failed verify-zero (retired)</td></tr>
 *   <tr><td>{@value #RECLAIMS}</td><td>counter</td><td>pages</td><td>outcome=hit|gone</td><td>reclaims of sealed pages</td></tr>
 *   <tr><td>{@value #LISTENER_FAILURES}</td><td>counter</td><td>events</td><td></td><td>page events a listener failed to take</td></tr>
 *   <tr><td>{@value #ADMISSION_LIMIT}</td><td>gauge</td><td>tokens</td><td>kind=effective|advertised</td><td>request length limits</td></tr>
 * </table>
 */
public final class MetricNames {
    public static final String PAGES = "kvshield.pages";
    public static final String PAGES_ALLOCATED = "kvshield.pages.allocated";
    public static final String PAGES_RELEASED = "kvshield.pages.released";
    public static final String ALLOCATIONS_NONE = "kvshield.allocations.none";
    public static final String PAGES_PROTECTED = "kvshield.pages.protected";
    public static final String BYTES_PROTECTED = "kvshield.bytes.protected";
    public static final String PROTECTION_TIME = "kvshield.protection.time";
    public static final String REJECTIONS = "kvshield.rejections";
    public static final String READ_BEFORE_WRITE = "kvshield.read.before.write";
    public static final String PROTECTION_FAILURES = "kvshield.protection.failures";
    public static final String VERIFY_FAILURES = "kvshield.verify.failures";
    public static final String RECLAIMS = "kvshield.reclaims";
    public static final String LISTENER_FAILURES = "kvshield.listener.failures";
    public static final String ADMISSION_LIMIT = "kvshield.admission.limit";
    public static final String AUDIT_RECORDS = "kvshield.audit.records";
    public static final String AUDIT_ALARMS = "kvshield.audit.alarms";
    public static final String AUDIT_CHECKPOINTS = "kvshield.audit.checkpoints";
    public static final String AUDIT_SHIP_FAILURES = "kvshield.audit.ship.failures";
    public static final String TENANT_PAGES_OWNED = "kvshield.tenant.pages.owned";
    public static final String HANDOFFS = "kvshield.handoffs";
    public static final String HANDOFF_ALARMS = "kvshield.handoff.alarms";
    public static final String HANDOFF_UNACKNOWLEDGED = "kvshield.handoff.unacknowledged";

    private MetricNames() {}
}
