/**
 * Claims: an in-flight writer or reader that does not hold the page's handle (a KV transfer, a
 * DMA engine) fences the page. A released page with claims stays quarantined until every claim is
 * dropped on evidence; expiry is an explicit fence that revokes the claim, never a free.
 */
package dev.kvshield.claims;
