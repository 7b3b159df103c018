/**
 * Internals of the audit trail: the event ring buffered per step, the JSON line codec, the hash
 * chain, the exposure tracker shared by the live trail and the offline query, and the rotating file
 * sink. Nothing outside {@code dev.kvshield.audit} uses these.
 */
package dev.kvshield.audit.internal;
