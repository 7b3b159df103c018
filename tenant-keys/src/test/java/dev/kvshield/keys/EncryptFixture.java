package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.PageEventListener;
import dev.kvshield.audit.PageEventType;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.cipher.BouncyChaCha;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/** Pools, plaintexts and byte oracles for the ENCRYPT tests. */
final class EncryptFixture {
    private EncryptFixture() {}

    /** 2 layers x {K, V}, 16 token slots of 32 bytes: 512-byte page regions, 8 usable pages. */
    static final PoolGeometry SMALL = PoolGeometry.builder().mha(2, 2, 8, 2).pageSizeTokens(16).pageCount(9).build();

    private static final String TEXT = "The prompt of tenant alice: account 4242, balance 1000000. ";

    /** One event as a pool reported it. */
    record Event(PageEventType type, int page, int generation, int tenant, long detail) {}

    /** Records every page event. */
    static final class Events implements PageEventListener {
        final List<Event> all = new ArrayList<>();

        @Override
        public synchronized void onPageEvent(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
            all.add(new Event(type, page, generation, tenant, detail));
        }

        synchronized List<Event> of(PageEventType type) {
            return all.stream().filter(e -> e.type() == type).toList();
        }
    }

    static KvPagePool encryptPool(PageMemory memory, PageSealerFactory sealer, String poolId, int rank, PageEventListener listener) {
        return KvPagePool.create(PoolConfig.builder(memory.geometry()).level(ProtectionLevel.ENCRYPT).sealer(sealer).poolId(poolId)
                .rank(rank).listener(listener).build(), memory);
    }

    /**
     * Structured, low-entropy plaintext (repeating text with runs of zeros), different per page and
     * buffer: a cipher that leaves patterns would show them.
     */
    static byte[] plaintext(int page, int buffer, int seed, int bytes) {
        byte[] b = new byte[bytes];
        for (int i = 0; i < bytes; i++) {
            b[i] = (i / 64) % 4 == 3 ? 0 : (byte) (TEXT.charAt((i + page * 7 + buffer * 3 + seed) % TEXT.length()));
        }
        return b;
    }

    /** Writes {@link #plaintext} into every buffer of an owned page through the pool. */
    static void writePage(KvPagePool pool, int tenant, long owner, long handle, int page, int seed) {
        PoolGeometry g = pool.geometry();
        try (Arena arena = Arena.ofConfined()) {
            for (int b = 0; b < g.bufferCount(); b++) {
                byte[] plain = plaintext(page, b, seed, (int) g.pageBytes(b));
                MemorySegment src = arena.allocate(plain.length);
                MemorySegment.copy(plain, 0, src, ValueLayout.JAVA_BYTE, 0, plain.length);
                pool.write(tenant, owner, handle, b, 0, src);
            }
        }
    }

    /** The raw bytes of one page region, straight from memory (what anyone reading the memory sees). */
    static byte[] raw(PageMemory memory, int page, int buffer) {
        return memory.hostRegion(page, buffer).toArray(ValueLayout.JAVA_BYTE);
    }

    /**
     * The isolation oracle for a sealed region: no byte pattern of the plaintext survives. Bytes
     * equal at the same offset stay near chance (1/256), no aligned 8-byte word of the plaintext
     * survives in place, and 64-byte blocks that repeat in the plaintext do not repeat in the
     * ciphertext.
     */
    static void assertNoPlaintextSurvives(byte[] plain, byte[] sealed, String where) {
        int equalBytes = 0;
        for (int i = 0; i < plain.length; i++) {
            if (plain[i] == sealed[i]) {
                equalBytes++;
            }
        }
        assertTrue(equalBytes <= plain.length / 256 * 3 + 6, where + ": " + equalBytes + " of " + plain.length
                + " bytes still equal the plaintext");
        for (int i = 0; i + 8 <= plain.length; i += 8) {
            boolean same = true;
            for (int j = i; j < i + 8 && same; j++) {
                same = plain[j] == sealed[j];
            }
            assertFalse(same, where + ": plaintext word at offset " + i + " survived");
        }
        Set<String> blocks = new HashSet<>();
        for (int i = 0; i + 64 <= sealed.length; i += 64) {
            assertTrue(blocks.add(java.util.HexFormat.of().formatHex(sealed, i, i + 64)), where + ": ciphertext block at " + i
                    + " repeats an earlier block");
        }
    }

    static void assertAllZero(byte[] bytes, String where) {
        for (int i = 0; i < bytes.length; i++) {
            assertTrue(bytes[i] == 0, where + ": byte " + i + " is " + bytes[i] + ", not zero");
        }
    }

    /** Checks a sealed region is exactly plaintext XOR the RFC 8439 keystream of the documented layout. */
    static void assertSealedWithReferenceKeystream(byte[] plain, byte[] sealed, byte[] key, int page, int generation, int buffer) {
        byte[] expected = plain.clone();
        BouncyChaCha.xor(key, page, generation, buffer, 0, expected);
        assertArrayEquals(expected, sealed, "page " + page + " generation " + generation + " buffer " + buffer);
    }
}
