/**
 * Prefill-to-decode handoffs, verified page by page. The decode side
 * ({@link dev.kvshield.handoff.HandoffReceiver}) commits a request only if the sender's published
 * coverage spans its sequence and every reserved page was written by this transfer in its current
 * generation; the prefill side ({@link dev.kvshield.handoff.HandoffSender}) admits a request before
 * anything else, so a request rejected for length never starts a handoff. Claims on both sides drain
 * only on the transport's acknowledgement, never on a timer.
 */
package dev.kvshield.handoff;
