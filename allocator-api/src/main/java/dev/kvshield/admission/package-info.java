/**
 * Admission: the effective request limit a pool can honour, computed at start from the engine's
 * advertised context length and what the pool holds; requests over it are rejected before any
 * page is reserved or any handoff starts.
 */
package dev.kvshield.admission;
