/**
 * The command line platform teams run ({@code ./kvshield report}, {@code replay-incident},
 * {@code check-config}): one entry point, {@link dev.kvshield.perf.cli.Main}, with subcommands.
 */
package dev.kvshield.perf.cli;
