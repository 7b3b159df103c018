/**
 * Page events and the tamper-evident audit trail built on them.
 *
 * <p>{@link dev.kvshield.audit.PageEventListener} receives every life-cycle step and rejection of
 * a pool. {@link dev.kvshield.audit.AuditTrail} is the listener that writes them, a record per run of
 * like events, as SHA-256 hash-chained JSON lines through an {@link dev.kvshield.audit.AuditSink}, with Ed25519-signed
 * checkpoints ({@link dev.kvshield.audit.AuditKeys}) shipped off the host
 * ({@link dev.kvshield.audit.CheckpointShipper}), one summary per finished request, and fail-closed
 * behaviour under {@code COMPLIANCE}. Reading back: {@link dev.kvshield.audit.AuditVerifier}
 * (needs only the pinned public key), {@link dev.kvshield.audit.ExposureQuery} (who received
 * whose data, and what was stopped), and the {@link dev.kvshield.audit.AuditTool} command line.
 *
 * <h2>On-disk format (format {@value dev.kvshield.audit.AuditTrail#FORMAT})</h2>
 *
 * <p>UTF-8 JSON lines, one record per line, in files rotated by size; the chain runs across them.
 * A record is {@code {"seq":N,"prev":"<hash of record N-1>","type":"...", fields...,"hash":"<hex>"}}
 * where {@code hash} is the SHA-256 of the line's bytes before {@code ,"hash":"} (record 0's
 * {@code prev} is 64 zeros). One trail is one boot of one pool's rank: its 128-bit random id is in
 * every record. A page-event record lists a run of like events ({@code pages}: entries
 * {@code [page, gen]}, or {@code [page, gen, times]} for an event repeated in a row, e.g. a read of
 * each of a page's buffers); each entry is one event (times {@code times}) with every other field of
 * the record. Within a step, each page's events keep their order across records; events of
 * different pages may be listed in another interleaving than they happened. Readers expand entries:
 * {@link dev.kvshield.audit.AuditLog.Line#pages()}.
 *
 * <table>
 *   <caption>record types (every record: seq, prev, type, mono, wall, trail, pool, rank, step, hash;
 *   mono and wall are the first event's)</caption>
 *   <tr><th>type</th><th>fields</th></tr>
 *   <tr><td>open</td><td>format (2), pageCount, slotsPerPage, level, signer (public-key fingerprint), then reads: false only in a
 *       trail whose pool's users read KV outside it (a hand-out then counts as a read of the page as handed out); absent:
 *       every read is recorded</td></tr>
 *   <tr><td>tenant</td><td>tenant (id), name, level, regulated — once per tenant, before its first event</td></tr>
 *   <tr><td>page events (lower-case {@link dev.kvshield.audit.PageEventType} names)</td><td>tenant, req or ns, the type's
 *       detail fields, then pages; write/read: slots [from, to), and for read (and, in a trail without reads, allocate)
 *       exposed (live judgement, true only when every page listed was exposed); claim_*: claim (hex, opaque), kind, peer; release: reason; protect_*: level; verify_failed
 *       (one page per record): level, alarm, releasedByTenant, releasedByReq; seal/reclaim/shred: keyEpoch, keyId
 *       (tenant@epoch, never key bytes); retire: reason; ownership_transfer: fromReq or fromNs; reader_added/removed: reader
 *       (tenant is the reader's); reject_*: handle (hex; page -1 for a malformed one); a type added later: detail if not 0,
 *       and claim, kind, peer if it came with them</td></tr>
 *   <tr><td>summary</td><td>tenant, req, label (the engine's name for the request, if it gave one), outcome,
 *       pagesRead [[page, gen]...], exposed, foreignSlotReads, unwrittenSlotReads,
 *       sources (tenant ids whose data reached it), sharedFrom (shared namespaces read), rejections, verifyFailedPages,
 *       and in a trail without reads foreignSlotsReceived (another tenant's unscrubbed slots in pages it was handed)</td></tr>
 *   <tr><td>checkpoint</td><td>upTo, head, signer, final, sig — sig is last: the Ed25519 signature over
 *       {@code "kvshield-audit-checkpoint-v2\n"} followed by the record's bytes up to {@code ,"sig":"}, so it covers every
 *       other field (seq, prev, trail, pool, rank, step, upTo, head, signer, final)</td></tr>
 * </table>
 *
 * <p>Format 1 (one record per event, {@code page} and {@code gen} fields, no trail id, checkpoints
 * signing only pool, rank, upTo and head) is refused by the verifier: a tail cut and re-marked final
 * verified. The query and history commands still read format-1 records.
 */
package dev.kvshield.audit;
