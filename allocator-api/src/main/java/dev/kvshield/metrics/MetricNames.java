package dev.kvshield.metrics;

/**
 * Every metric kvshield publishes. All carry the tags {@code pool} (pool id) and {@code rank}
 * (tensor-parallel rank). The Prometheus column is the name {@link PrometheusEndpoint} serves
 * (Micrometer appends the unit and {@code _total} for counters; timers add {@code _count},
 * {@code _sum} and {@code _max}).
 *
 * <table>
 *   <caption>metrics</caption>
 *   <tr><th>name</th><th>Prometheus</th><th>type</th><th>unit</th><th>extra tags</th><th>meaning</th></tr>
 *   <tr><td>{@value #PAGES}</td><td>kvshield_pages</td><td>gauge</td><td>pages</td><td>state=free|sealed|owned|quarantined|retired|claimed</td><td>pages by life-cycle state ({@code claimed}: pages with live or revoked claims)</td></tr>
 *   <tr><td>{@value #PAGES_ALLOCATED}</td><td>kvshield_pages_allocated_pages_total</td><td>counter</td><td>pages</td><td></td><td>pages handed out (allocate and reclaim)</td></tr>
 *   <tr><td>{@value #PAGES_RELEASED}</td><td>kvshield_pages_released_pages_total</td><td>counter</td><td>pages</td><td></td><td>pages released by their owners</td></tr>
 *   <tr><td>{@value #ALLOCATIONS_NONE}</td><td>kvshield_allocations_none_calls_total</td><td>counter</td><td>calls</td><td></td><td>allocations answered "none" (pool or quota exhausted)</td></tr>
 *   <tr><td>{@value #PAGES_PROTECTED}</td><td>kvshield_pages_protected_pages_total</td><td>counter</td><td>pages</td><td>level</td><td>pages whose protection was confirmed</td></tr>
 *   <tr><td>{@value #BYTES_PROTECTED}</td><td>kvshield_bytes_protected_bytes_total</td><td>counter</td><td>bytes</td><td>level</td><td>page bytes scrubbed, sealed or verified</td></tr>
 *   <tr><td>{@value #PROTECTION_TIME}</td><td>kvshield_protection_time_seconds_{count,sum,max}</td><td>timer</td><td>seconds</td><td>level</td><td>time spent in backend protection calls</td></tr>
 *   <tr><td>{@value #REJECTIONS}</td><td>kvshield_rejections_calls_total</td><td>counter</td><td>calls</td><td>reason=stale|double_free|foreign|invalid|revoked_claim|unknown_tenant</td><td>misuse rejected</td></tr>
 *   <tr><td>{@value #READ_BEFORE_WRITE}</td><td>kvshield_read_before_write_calls_total</td><td>counter</td><td>calls</td><td></td><td>reads of slots not written in the current generation</td></tr>
 *   <tr><td>{@value #PROTECTION_FAILURES}</td><td>kvshield_protection_failures_pages_total</td><td>counter</td><td>pages</td><td></td><td>pages whose protection failed (kept out of FREE)</td></tr>
 *   <tr><td>{@value #VERIFY_FAILURES}</td><td>kvshield_verify_failures_pages_total</td><td>counter</td><td>pages</td><td></td><td>pages that failed verify-zero (retired)</td></tr>
 *   <tr><td>{@value #RECLAIMS}</td><td>kvshield_reclaims_pages_total</td><td>counter</td><td>pages</td><td>outcome=hit|gone</td><td>reclaims of sealed pages</td></tr>
 *   <tr><td>{@value #LISTENER_FAILURES}</td><td>kvshield_listener_failures_events_total</td><td>counter</td><td>events</td><td></td><td>page events a listener failed to take</td></tr>
 *   <tr><td>{@value #ADMISSION_LIMIT}</td><td>kvshield_admission_limit_tokens</td><td>gauge</td><td>tokens</td><td>kind=effective|advertised</td><td>request length limits</td></tr>
 *   <tr><td>{@value #AUDIT_RECORDS}</td><td>kvshield_audit_records_total</td><td>counter</td><td>records</td><td>outcome=written|dropped</td><td>audit records written, or dropped because the sink could not write</td></tr>
 *   <tr><td>{@value #AUDIT_ALARMS}</td><td>kvshield_audit_alarms_pages_total</td><td>counter</td><td>pages</td><td></td><td>verify-failed pages raised as audit alarms</td></tr>
 *   <tr><td>{@value #AUDIT_CHECKPOINTS}</td><td>kvshield_audit_checkpoints_total</td><td>counter</td><td>checkpoints</td><td></td><td>signed checkpoints written</td></tr>
 *   <tr><td>{@value #AUDIT_SHIP_FAILURES}</td><td>kvshield_audit_ship_failures_checkpoints_total</td><td>counter</td><td>checkpoints</td><td></td><td>checkpoints a shipper failed to send off the host</td></tr>
 *   <tr><td>{@value #TENANT_PAGES_OWNED}</td><td>kvshield_tenant_pages_owned_pages</td><td>gauge</td><td>pages</td><td>tenant (opted-in tenants only, see {@link TenantMetrics})</td><td>pages a tenant owns</td></tr>
 *   <tr><td>{@value #HANDOFFS}</td><td>kvshield_handoffs_requests_total</td><td>counter</td><td>requests</td><td>outcome (a {@code HandoffOutcome}, lower case)</td><td>prefill-to-decode handoffs by outcome</td></tr>
 *   <tr><td>{@value #HANDOFF_ALARMS}</td><td>kvshield_handoff_alarms_transfers_total</td><td>counter</td><td>transfers</td><td></td><td>handoffs whose transfer misbehaved (raised as alarms)</td></tr>
 *   <tr><td>{@value #HANDOFF_UNACKNOWLEDGED}</td><td>kvshield_handoff_unacknowledged_transfers</td><td>gauge</td><td>transfers</td><td></td><td>reservations whose claims still hold pages</td></tr>
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
