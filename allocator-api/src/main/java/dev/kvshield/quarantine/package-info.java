/**
 * Quarantine: where released pages wait until their claims drain and their protection is
 * confirmed. Pages leave it only at a step boundary the engine calls (or a drain under allocation
 * pressure), so every tensor-parallel rank decides identically.
 */
package dev.kvshield.quarantine;
