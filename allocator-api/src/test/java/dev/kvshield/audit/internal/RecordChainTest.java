package dev.kvshield.audit.internal;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * The byte encoder against the text definition of the format (a {@link StringBuilder} line with
 * {@link Json#string}, {@link Long#toString}, {@link Long#toHexString}, UTF-8-encoded by
 * {@link String#getBytes}, SHA-256 of the body), over seeded random strings and numbers.
 */
class RecordChainTest {
    private static final byte[] TYPE = RecordChain.literal("t");
    private static final byte[] S = RecordChain.key("s");
    private static final byte[] N = RecordChain.key("n");
    private static final byte[] H = RecordChain.key("h");
    private static final byte[] L = RecordChain.key("l");

    /** Characters that need escaping, ASCII, 2- and 3-byte UTF-8, surrogate pairs and lone surrogates. */
    private static String randomString(SplittableRandom rng) {
        StringBuilder sb = new StringBuilder();
        int n = rng.nextInt(4) == 0 ? rng.nextInt(3000) : rng.nextInt(40);
        for (int i = 0; i < n; i++) {
            switch (rng.nextInt(7)) {
                case 0 -> sb.append((char) rng.nextInt(0x20));
                case 1 -> sb.append("\"\\/\t\n\r".charAt(rng.nextInt(6)));
                case 2 -> sb.append((char) (0x80 + rng.nextInt(0x800 - 0x80)));
                case 3 -> sb.append((char) (0x800 + rng.nextInt(0xD800 - 0x800)));
                case 4 -> sb.appendCodePoint(0x10000 + rng.nextInt(0x110000 - 0x10000));
                case 5 -> sb.append((char) (0xD800 + rng.nextInt(0x800)));
                default -> sb.append((char) (0x20 + rng.nextInt(0x60)));
            }
        }
        return sb.toString();
    }

    private static long randomLong(SplittableRandom rng) {
        return switch (rng.nextInt(4)) {
            case 0 -> new long[] {0, -1, 9, 10, Long.MIN_VALUE, Long.MAX_VALUE, Integer.MIN_VALUE}[rng.nextInt(7)];
            case 1 -> rng.nextInt(1000) - 500;
            default -> rng.nextLong();
        };
    }

    @Test
    void bytesEqualTheTextFormatForRandomRecords() {
        long seed = 0xA0D17L;
        SplittableRandom rng = new SplittableRandom(seed);
        RecordChain chain = new RecordChain();
        StringBuilder expected = new StringBuilder();
        String prev = RecordChain.GENESIS;
        for (int seq = 0; seq < 400; seq++) {
            String s = randomString(rng);
            long n = randomLong(rng);
            long h = randomLong(rng);
            chain.begin(TYPE).field(S, s).field(N, n).hexField(H, h).key(L).raw('[').number(n).raw(',').number((int) h).raw(']').end();
            StringBuilder body = new StringBuilder("{\"seq\":").append(seq).append(",\"prev\":\"").append(prev).append("\",\"type\":\"t\",\"s\":");
            Json.string(body, s);
            body.append(",\"n\":").append(n).append(",\"h\":\"").append(Long.toHexString(h)).append("\",\"l\":[").append(n).append(',')
                    .append((int) h).append(']');
            prev = RecordChain.hashOf(RecordChain.sha256(), body.toString());
            expected.append(body).append(RecordChain.HASH_FIELD).append(prev).append("\"}\n");
            assertEquals(prev, chain.head(), "seed " + seed + " seq " + seq);
        }
        byte[] want = expected.toString().getBytes(StandardCharsets.UTF_8);
        assertEquals(400, chain.records());
        assertArrayEquals(want, Arrays.copyOf(chain.bytes(), chain.length()), "seed " + seed);
        chain.clear();
        assertEquals(0, chain.length());
        assertEquals(400, chain.nextSeq(), "clearing the batch keeps the chain going");
    }

    @Test
    void fieldNamesMustBePlainIdentifiers() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> RecordChain.key("a\"b"));
        assertEquals("a record field name must be an ASCII identifier: 'a\"b'", e.getMessage());
    }
}
