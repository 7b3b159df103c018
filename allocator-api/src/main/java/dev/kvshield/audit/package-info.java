/**
 * Page events: every life-cycle step and every rejection, delivered synchronously to
 * {@link dev.kvshield.audit.PageEventListener}s. The audit trail builds on this.
 */
package dev.kvshield.audit;
