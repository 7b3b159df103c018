/**
 * Incident replays: named production incidents (a rejected oversized request still handed off, a
 * late transfer writing into reused pages, a lease that expires while a transfer still reads)
 * replayed through {@code stock} and every kvshield level, with the leak oracle reading every
 * response. Under {@code stock} they leak (the threat is real); under every kvshield level they do
 * not, and the offending requests end in errors.
 */
package dev.kvshield.perf.replay;
