/**
 * Written extent: per page and generation, which token slots were written. Reading a slot not
 * written in the current generation is an error, not data.
 */
package dev.kvshield.extent;
