package dev.kvshield.keys;

import dev.kvshield.keys.internal.Hkdf;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.function.Consumer;

/**
 * A root key: {@link #KEY_BYTES} bytes off-heap, zeroed and freed by {@link #close()}. Only its
 * {@link #keyId()} (a one-way fingerprint) may appear in logs, metrics, exceptions or audit records.
 *
 * <p>Thread-safe. No {@code toString}, {@code equals} or {@code hashCode} beyond
 * {@link Object}'s: a key is never printed or compared by value.
 */
public final class RootKey implements AutoCloseable {
    /** Bytes of a root key. */
    public static final int KEY_BYTES = 32;
    private static final byte[] KEY_ID_SALT = "kvshield/root-key-id/v1".getBytes(StandardCharsets.UTF_8);
    private static final int KEY_ID_BYTES = 8;

    private final Arena arena;
    private final MemorySegment key;
    private final String keyId;
    private volatile boolean closed;

    private RootKey(Arena arena, MemorySegment key) {
        this.arena = arena;
        this.key = key;
        try (Arena scratch = Arena.ofConfined()) {
            MemorySegment id = scratch.allocate(KEY_ID_BYTES);
            Hkdf.deriveSha256(key, KEY_ID_SALT, new byte[0], id);
            this.keyId = "root-" + HexFormat.of().formatHex(id.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE));
        }
    }

    /**
     * Allocates a key off-heap and lets {@code filler} write its {@link #KEY_BYTES} bytes; on any
     * failure the memory is zeroed and freed before the exception propagates.
     */
    static RootKey fill(Consumer<MemorySegment> filler) {
        Arena arena = Arena.ofShared();
        MemorySegment key = arena.allocate(KEY_BYTES, 32);
        try {
            filler.accept(key);
            return new RootKey(arena, key);
        } catch (RuntimeException | Error e) {
            key.fill((byte) 0);
            arena.close();
            throw e;
        }
    }

    /**
     * Reads exactly {@link #KEY_BYTES} bytes from {@code channel} straight into {@code key}
     * (no heap copy) and checks the channel then ends.
     *
     * @throws KeySourceException naming {@code origin} and the size found
     */
    static void readExactly(ReadableByteChannel channel, MemorySegment key, String origin) throws IOException {
        ByteBuffer dst = key.asByteBuffer();
        while (dst.hasRemaining()) {
            if (channel.read(dst) < 0) {
                throw new KeySourceException(origin + " holds " + dst.position() + " bytes; a root key is exactly " + KEY_BYTES
                        + " raw bytes");
            }
        }
        try (Arena probeArena = Arena.ofConfined()) {
            ByteBuffer probe = probeArena.allocate(1).asByteBuffer();
            int n;
            do {
                n = channel.read(probe);
            } while (n == 0);
            if (n > 0) {
                probe.put(0, (byte) 0);
                throw new KeySourceException(origin + " holds more than " + KEY_BYTES + " bytes; a root key is exactly "
                        + KEY_BYTES + " raw bytes");
            }
        }
    }

    /** The key's fingerprint ({@code root-} and 16 hex digits of an HKDF of the key): safe to log. */
    public String keyId() {
        return keyId;
    }

    /** The key bytes, for derivation inside this package; throws once closed. */
    MemorySegment segment() {
        if (closed) {
            throw new KeyUnavailableException("root key " + keyId + " is closed");
        }
        return key;
    }

    /** Zeroes and frees the key; idempotent. */
    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            key.fill((byte) 0);
            arena.close();
        }
    }
}
