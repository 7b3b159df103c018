/**
 * Prefill-to-decode handoffs for SGLang's disaggregation mode: {@link dev.kvshield.bridge.handoff.HandoffBridge}
 * maps SGLang's request ids and page ids onto allocator-api's {@code HandoffReceiver} and
 * {@code HandoffSender} over a {@link dev.kvshield.bridge.SlotAllocator}'s pool, and keeps the
 * allocator's page table in step with the pages handoffs reserve and release.
 * {@link dev.kvshield.bridge.handoff.PrefillSends} holds the prefill side's reader claims on a
 * the source pages each chunk hands the transport (the request's own, its tenant's cached or
 * shared prefix), chunk by chunk.
 */
package dev.kvshield.bridge.handoff;
