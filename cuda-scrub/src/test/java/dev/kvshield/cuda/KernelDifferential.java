package dev.kvshield.cuda;

import dev.kvshield.cuda.kernel.KernelAbi;
import dev.kvshield.cuda.kernel.PageKeystreamXor;
import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.function.Function;
import org.bouncycastle.crypto.engines.ChaCha7539Engine;
import org.bouncycastle.crypto.params.KeyParameter;
import org.bouncycastle.crypto.params.ParametersWithIV;

/**
 * Byte-for-byte differential runs of a kernel backend (host build or GPU) against the CPU
 * references: the off-heap backend for scrub and verify-zero, Bouncy Castle's RFC 8439
 * {@code ChaCha7539Engine} for chacha20-xor. Geometries, contents, page lists and keys come from
 * a seeded {@link SplittableRandom}; a result names the seed and case so a failure replays.
 */
final class KernelDifferential {
    private KernelDifferential() {}

    /**
     * A geometry with 1-4 layers, MHA, MLA or three kinds of different widths, or an explicit list of
     * 1-9 buffers of any kinds and widths; page sizes often not multiples of 16.
     */
    static PoolGeometry randomGeometry(SplittableRandom r) {
        PoolGeometry.Builder b = PoolGeometry.builder().pageSizeTokens(1 + r.nextInt(20)).pageCount(2 + r.nextInt(11))
                .pageZeroReserved(r.nextBoolean());
        int layers = 1 + r.nextInt(4);
        switch (r.nextInt(4)) {
            case 0 -> b.mha(layers, 1 + r.nextInt(3), 1 + r.nextInt(24), 1 + r.nextInt(2));
            case 1 -> b.mla(layers, 1 + r.nextInt(70), 1);
            case 2 -> b.layers(layers).buffers(List.of(BufferKind.K, BufferKind.V, BufferKind.LATENT), 1 + r.nextInt(80),
                    1 + r.nextInt(80), 1 + r.nextInt(80));
            default -> { // an explicit list: any kinds, every buffer its own width (scales, indexers, draft layers)
                BufferKind[] kinds = BufferKind.values();
                int buffers = 1 + r.nextInt(9);
                for (int i = 0; i < buffers; i++) {
                    b.buffer(kinds[r.nextInt(kinds.length)], "buffer" + i, 1 + r.nextInt(r.nextBoolean() ? 4 : 150));
                }
            }
        }
        return b.build();
    }

    /**
     * Fills both backends with the same random bytes, applies the same random scrub lists (pages may
     * repeat), plants non-zero bytes and compares verify-zero answers and every byte of every buffer.
     *
     * @return {@code null} if the backend matched the reference everywhere, else the first difference
     */
    static String scrubAndVerify(long seed, int cases, Function<PoolGeometry, PageMemory> factory) {
        SplittableRandom r = new SplittableRandom(seed);
        for (int c = 0; c < cases; c++) {
            PoolGeometry g = randomGeometry(r);
            try (PageMemory ref = OffHeapPageMemory.allocate(g); PageMemory test = factory.apply(g);
                    Arena arena = Arena.ofConfined()) {
                fillRandom(r, g, arena, ref, test);
                for (int round = 0; round < 3; round++) {
                    int[] list = randomList(r, g, true);
                    int offset = r.nextInt(list.length);
                    int count = r.nextInt(list.length - offset + 1);
                    ref.scrub(list, offset, count);
                    test.scrub(list, offset, count);
                    String diff = compare(g, arena, ref, test);
                    if (diff != null) {
                        return "seed " + seed + " case " + c + " " + g + " scrub " + Arrays.toString(list) + " [" + offset + ", +"
                                + count + "): " + diff;
                    }
                }
                // One non-zero byte at a random spot of a few pages, then verify a random list.
                for (int k = 0; k < 1 + r.nextInt(3); k++) {
                    int page = r.nextInt(g.pageCount());
                    int buffer = r.nextInt(g.bufferCount());
                    MemorySegment token = arena.allocate(g.bytesPerToken(buffer));
                    token.set(ValueLayout.JAVA_BYTE, r.nextInt((int) token.byteSize()), (byte) (1 + r.nextInt(255)));
                    int slot = r.nextInt(g.pageSizeTokens());
                    ref.write(page, buffer, slot, token);
                    test.write(page, buffer, slot, token);
                }
                int[] list = randomList(r, g, true);
                int[] refDirty = new int[list.length];
                int[] testDirty = new int[list.length];
                int refN = ref.verifyZero(list, 0, list.length, refDirty);
                int testN = test.verifyZero(list, 0, list.length, testDirty);
                if (refN != testN || !Arrays.equals(refDirty, 0, refN, testDirty, 0, testN)) {
                    return "seed " + seed + " case " + c + " " + g + " verifyZero " + Arrays.toString(list) + ": reference "
                            + Arrays.toString(Arrays.copyOf(refDirty, refN)) + " kernel "
                            + Arrays.toString(Arrays.copyOf(testDirty, testN));
                }
            }
        }
        return null;
    }

    /**
     * Seals random distinct pages of random geometries with up to {@link KernelAbi#MAX_KEY_SLOTS}
     * random keys on the backend and with Bouncy Castle on the reference, compares every byte,
     * then unseals on the backend and checks the original bytes are back. The backend implements
     * {@link PageKeystreamXor}.
     */
    static String chacha(long seed, int cases, Function<PoolGeometry, PageMemory> factory) {
        SplittableRandom r = new SplittableRandom(seed);
        for (int c = 0; c < cases; c++) {
            PoolGeometry g = randomGeometry(r);
            try (PageMemory ref = OffHeapPageMemory.allocate(g); PageMemory original = OffHeapPageMemory.allocate(g);
                    PageMemory test = factory.apply(g); Arena arena = Arena.ofConfined()) {
                fillRandom(r, g, arena, ref, test, original);
                int keyCount = 1 + r.nextInt(KernelAbi.MAX_KEY_SLOTS);
                byte[][] keys = new byte[keyCount][KernelAbi.KEY_BYTES];
                for (byte[] key : keys) {
                    r.nextBytes(key);
                }
                int[] pages = randomList(r, g, false);
                int[] generations = new int[pages.length];
                byte[] slots = new byte[pages.length];
                for (int i = 0; i < pages.length; i++) {
                    generations[i] = r.nextInt();
                    slots[i] = (byte) r.nextInt(keyCount);
                }
                PageKeystreamXor.KeyLoader loader = s -> {
                    for (int k = 0; k < keyCount; k++) {
                        MemorySegment.copy(MemorySegment.ofArray(keys[k]), 0, s.slot(k), 0, KernelAbi.KEY_BYTES);
                    }
                };
                ((PageKeystreamXor) test).chacha20Xor(pages, generations, slots, 0, pages.length, keyCount, loader);
                for (int i = 0; i < pages.length; i++) {
                    for (int b = 0; b < g.bufferCount(); b++) {
                        referenceXor(ref.hostRegion(pages[i], b), keys[slots[i]], pages[i], generations[i], b);
                    }
                }
                String diff = compare(g, arena, ref, test);
                if (diff != null) {
                    return "seed " + seed + " case " + c + " " + g + " seal " + Arrays.toString(pages) + ": " + diff;
                }
                ((PageKeystreamXor) test).chacha20Xor(pages, generations, slots, 0, pages.length, keyCount, loader);
                diff = compare(g, arena, original, test);
                if (diff != null) {
                    return "seed " + seed + " case " + c + " " + g + " unseal " + Arrays.toString(pages) + ": " + diff;
                }
            }
        }
        return null;
    }

    /** RFC 8439 ChaCha20 (Bouncy Castle) over one page region: nonce (page, generation, buffer), counter from 0. */
    static void referenceXor(MemorySegment region, byte[] key, int page, int generation, int buffer) {
        byte[] nonce = new byte[12];
        MemorySegment n = MemorySegment.ofArray(nonce);
        n.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN), 0, page);
        n.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN), 4, generation);
        n.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN), 8, buffer);
        ChaCha7539Engine engine = new ChaCha7539Engine();
        engine.init(true, new ParametersWithIV(new KeyParameter(key), nonce));
        byte[] bytes = region.toArray(ValueLayout.JAVA_BYTE);
        engine.processBytes(bytes, 0, bytes.length, bytes, 0);
        MemorySegment.copy(MemorySegment.ofArray(bytes), 0, region, 0, bytes.length);
    }

    /** Writes the same random bytes into every page of every buffer of each memory. */
    static void fillRandom(SplittableRandom r, PoolGeometry g, Arena arena, PageMemory... memories) {
        for (int p = 0; p < g.pageCount(); p++) {
            for (int b = 0; b < g.bufferCount(); b++) {
                byte[] bytes = new byte[(int) g.pageBytes(b)];
                r.nextBytes(bytes);
                MemorySegment src = arena.allocate(bytes.length);
                MemorySegment.copy(MemorySegment.ofArray(bytes), 0, src, 0, bytes.length);
                for (PageMemory m : memories) {
                    m.write(p, b, 0, src);
                }
            }
        }
    }

    private static int[] randomList(SplittableRandom r, PoolGeometry g, boolean repeats) {
        if (repeats) {
            int[] list = new int[1 + r.nextInt(g.pageCount())];
            Arrays.setAll(list, i -> r.nextInt(g.pageCount()));
            return list;
        }
        int[] all = new int[g.pageCount()];
        Arrays.setAll(all, i -> i);
        for (int i = all.length - 1; i > 0; i--) {
            int j = r.nextInt(i + 1);
            int t = all[i];
            all[i] = all[j];
            all[j] = t;
        }
        return Arrays.copyOf(all, 1 + r.nextInt(all.length));
    }

    /** The first byte where two backends differ ("page p buffer b differs at byte i"), or {@code null}. */
    static String compare(PoolGeometry g, Arena arena, PageMemory expected, PageMemory actual) {
        for (int p = 0; p < g.pageCount(); p++) {
            for (int b = 0; b < g.bufferCount(); b++) {
                MemorySegment e = arena.allocate(g.pageBytes(b));
                MemorySegment a = arena.allocate(g.pageBytes(b));
                expected.read(p, b, 0, e);
                actual.read(p, b, 0, a);
                long at = e.mismatch(a);
                if (at != -1) {
                    return "page " + p + " buffer " + b + " differs at byte " + at + " of " + g.pageBytes(b);
                }
            }
        }
        return null;
    }
}
