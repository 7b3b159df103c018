/**
 * Claims: an in-flight writer or reader that does not hold the page as owner (a KV transfer, a DMA
 * engine) fences the page with a claim, a lease of kind {@code CLAIM_WRITER} or {@code
 * CLAIM_READER} ({@link dev.kvshield.lease}). A released page with claims stays quarantined until
 * every claim is dropped on evidence; expiry is an explicit fence, never a free.
 */
package dev.kvshield.claims;
