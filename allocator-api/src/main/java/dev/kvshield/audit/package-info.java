/**
 * Page events and the tamper-evident audit trail built on them.
 *
 * <p>{@link dev.kvshield.audit.PageEventListener} receives every life-cycle step and rejection of
 * a pool. {@link dev.kvshield.audit.AuditTrail} is the listener that writes them as SHA-256
 * hash-chained JSON lines through an {@link dev.kvshield.audit.AuditSink}, with Ed25519-signed
 * checkpoints ({@link dev.kvshield.audit.AuditKeys}) shipped off the host
 * ({@link dev.kvshield.audit.CheckpointShipper}), one summary per finished request, and fail-closed
 * behaviour under {@code COMPLIANCE}. Reading back: {@link dev.kvshield.audit.AuditVerifier}
 * (needs only the pinned public key), {@link dev.kvshield.audit.ExposureQuery} (who received
 * whose data, and what was stopped), and the {@link dev.kvshield.audit.AuditTool} command line.
 *
 * <table>
 *   <caption>record types (every record: seq, prev, type, mono, wall, pool, rank, step, hash)</caption>
 *   <tr><th>type</th><th>fields</th></tr>
 *   <tr><td>open</td><td>pageCount, slotsPerPage, level, signer (public-key fingerprint)</td></tr>
 *   <tr><td>tenant</td><td>tenant (id), name, level, regulated — once per tenant, before its first event</td></tr>
 *   <tr><td>page events (lower-case {@link dev.kvshield.audit.PageEventType} names)</td><td>page, gen, tenant, req or ns; write/read: slots [from, to) and exposed
 *       (live judgement); claim_*: claim, kind, peer; release: reason; protect_*: level; verify_failed: level, alarm,
 *       releasedByTenant, releasedByReq; seal/reclaim/shred: keyEpoch, keyId (tenant@epoch, never key bytes); retire: reason;
 *       ownership_transfer: fromReq or fromNs; reader_added/removed: reader (tenant is the reader's); reject_*: handle</td></tr>
 *   <tr><td>summary</td><td>tenant, req, outcome, pagesRead [[page, gen]...], exposed, foreignSlotReads, unwrittenSlotReads,
 *       sources (tenant ids whose data reached it), sharedFrom (shared namespaces read), rejections, verifyFailedPages</td></tr>
 *   <tr><td>checkpoint</td><td>upTo, head, signer, sig (Ed25519 over pool, rank, upTo, head), final</td></tr>
 * </table>
 */
package dev.kvshield.audit;
