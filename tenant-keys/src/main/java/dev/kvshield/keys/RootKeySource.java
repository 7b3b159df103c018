package dev.kvshield.keys;

import java.nio.file.Path;

/**
 * Where a pool's root key comes from. Deliberately no environment-variable source: engines spawn
 * worker processes that inherit the environment and expose it under {@code /proc/<pid>/environ}.
 *
 * <ul>
 *   <li>{@link #keyFile(Path)}: exactly 32 raw bytes in a file only its owner may read; a file that
 *       group or others can read or write is refused, and the error says so.
 *   <li>{@link #inheritedFd(int)}: exactly 32 raw bytes read from a file descriptor the parent
 *       process passed in (a pipe, so the key never touches a disk).
 *   <li>{@link #ephemeral()}: a random key for development, logged as such once; nothing sealed
 *       under it outlives the process.
 * </ul>
 *
 * <p>Implementations are thread-safe; {@link #describe()} never contains key material.
 */
public interface RootKeySource extends AutoCloseable {
    /**
     * Loads the root key into off-heap memory the caller owns and must close.
     *
     * @throws KeySourceException if the key cannot be loaded safely
     */
    RootKey load();

    /** Where keys come from, for logs and errors (a path or descriptor number, never key bytes). */
    String describe();

    /** Zeroes anything the source itself holds (the ephemeral key); idempotent. */
    @Override
    default void close() {}

    /** A key file: exactly 32 raw bytes, readable and writable by its owner only. */
    static RootKeySource keyFile(Path path) {
        return new KeyFileRootKeySource(path);
    }

    /** An inherited file descriptor (read through {@code /proc/self/fd/<fd>}) holding exactly 32 raw bytes. */
    static RootKeySource inheritedFd(int fd) {
        return new InheritedFdRootKeySource(fd);
    }

    /** A random root key generated once per source, for development only (logged as such). */
    static RootKeySource ephemeral() {
        return new EphemeralRootKeySource();
    }
}
