package dev.kvshield.audit.internal;

import java.nio.charset.StandardCharsets;
import java.security.DigestException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.HexFormat;

/**
 * The hash chain and the line format of audit records. A record is one JSON object on one line:
 *
 * <pre>
 * {"seq":N,"prev":"&lt;hash of record N-1&gt;", ...fields... ,"hash":"&lt;SHA-256 of everything before ,"hash"&gt;"}
 * </pre>
 *
 * The hashed bytes are the UTF-8 bytes of the line up to (not including) {@code ,"hash":"}: they
 * contain the previous hash, so each record commits to the whole chain before it. Record 0 has
 * {@link #GENESIS} as its {@code prev}. Writing and verifying use the same bytes, so no
 * re-canonicalisation is needed.
 *
 * <p>Records are encoded straight into one reused batch buffer as UTF-8 lines, each ending in
 * {@code '\n'}, until {@link #clear()}: a writer builds a step's records, hands
 * {@link #bytes()}{@code [0, }{@link #length()}{@code )} to its sink and clears. Field names and
 * fixed string values are encoded once ({@link #key}, {@link #literal}); after the buffer has grown
 * to the largest batch, encoding, hashing and hex-encoding a record allocate nothing.
 *
 * <p>Not thread-safe: one chain per writer, used under its owner's lock.
 */
public final class RecordChain {
    public static final String GENESIS = "0".repeat(64);
    public static final String HASH_FIELD = ",\"hash\":\"";
    /** A checkpoint's signature field: the last field of its body, after everything it signs. */
    public static final String SIG_FIELD = ",\"sig\":\"";
    /** What a checkpoint signature is over, before the record's bytes (format 2; format 1 signed four fields only). */
    private static final byte[] CHECKPOINT_DOMAIN = ascii("kvshield-audit-checkpoint-v2\n");
    private static final HexFormat HEX = HexFormat.of();
    private static final byte[] HEX_DIGITS = ascii("0123456789abcdef");
    private static final byte[] HASH_FIELD_BYTES = ascii(HASH_FIELD);
    private static final byte[] SEQ = ascii("{\"seq\":");
    private static final byte[] PREV = ascii(",\"prev\":\"");
    private static final byte[] TYPE = ascii("\",\"type\":");
    private static final byte[] TRUE = ascii("true");
    private static final byte[] FALSE = ascii("false");
    private static final byte[] MIN_LONG = ascii(Long.toString(Long.MIN_VALUE));
    /** 10^0 to 10^18. */
    private static final long[] POWERS_OF_TEN = powersOfTen();
    /** "00" to "99", two bytes each. */
    private static final byte[] DIGIT_PAIRS = digitPairs();
    /** {@link Json#escape} of each ASCII character as bytes; null where the character stands as is. */
    private static final byte[][] ESCAPES = escapes();
    private static final int HASH_BYTES = 32;
    private static final int LONG_MAX_CHARS = 20;
    private static final int INITIAL_BATCH_BYTES = 64 * 1024;

    private final MessageDigest sha256 = sha256();
    private final byte[] digest = new byte[HASH_BYTES];
    /** The hex of the last record's hash (ASCII). */
    private final byte[] head = ascii(GENESIS);
    private byte[] batch = new byte[INITIAL_BATCH_BYTES];
    private int length;
    private int records;
    private int recordStart;
    private long nextSeq;

    public static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("the JDK has no SHA-256", e);
        }
    }

    private static byte[] ascii(String s) {
        return s.getBytes(StandardCharsets.US_ASCII);
    }

    private static byte[] digitPairs() {
        byte[] pairs = new byte[200];
        for (int i = 0; i < 100; i++) {
            pairs[2 * i] = (byte) ('0' + i / 10);
            pairs[2 * i + 1] = (byte) ('0' + i % 10);
        }
        return pairs;
    }

    private static long[] powersOfTen() {
        long[] p = new long[19];
        p[0] = 1;
        for (int i = 1; i < p.length; i++) {
            p[i] = 10 * p[i - 1];
        }
        return p;
    }

    private static byte[][] escapes() {
        byte[][] e = new byte[0x80][];
        for (char c = 0; c < e.length; c++) {
            String escape = Json.escape(c);
            e[c] = escape == null ? null : ascii(escape);
        }
        return e;
    }

    /** The SHA-256 hex of a record's body, as {@link #end()} computes it. */
    public static String hashOf(MessageDigest digest, String body) {
        return HEX.formatHex(digest.digest(body.getBytes(StandardCharsets.UTF_8)));
    }

    /** The body of a record line (the hashed part), or null if the line has no well-placed hash field. */
    public static String bodyOf(String line) {
        int at = line.lastIndexOf(HASH_FIELD);
        if (at < 0 || !line.endsWith("\"}") || line.length() != at + HASH_FIELD.length() + 64 + 2) {
            return null;
        }
        return line.substring(0, at);
    }

    /** The hash stored in a record line whose {@link #bodyOf} is not null. */
    public static String storedHashOf(String line) {
        return line.substring(line.length() - 66, line.length() - 2);
    }

    /**
     * The bytes a checkpoint signs: a domain prefix, then the checkpoint record's own bytes from its
     * opening brace up to (not including) its {@link #SIG_FIELD}, which is its last field. So the
     * signature covers every other field of the record (sequence, previous hash, trail id, pool,
     * rank, times, {@code upTo}, {@code head}, signer, {@code final}) whatever fields a later format adds.
     */
    public static byte[] checkpointMessage(byte[] signedBody) {
        byte[] m = Arrays.copyOf(CHECKPOINT_DOMAIN, CHECKPOINT_DOMAIN.length + signedBody.length);
        System.arraycopy(signedBody, 0, m, CHECKPOINT_DOMAIN.length, signedBody.length);
        return m;
    }

    /**
     * The encoded field prefix {@code ,"name":} for {@link #field} and friends.
     *
     * @throws IllegalArgumentException if {@code name} is not a plain ASCII identifier
     */
    public static byte[] key(String name) {
        if (!name.matches("[A-Za-z][A-Za-z0-9]*")) {
            throw new IllegalArgumentException("a record field name must be an ASCII identifier: '" + name + "'");
        }
        return ascii(",\"" + name + "\":");
    }

    /** {@code value} encoded once as a JSON string literal (quotes included), for fixed values. */
    public static byte[] literal(String value) {
        StringBuilder sb = new StringBuilder();
        Json.string(sb, value);
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    public long nextSeq() {
        return nextSeq;
    }

    /** The hash of the last record ended, or {@link #GENESIS}. */
    public String head() {
        return new String(head, StandardCharsets.US_ASCII);
    }

    /** The batch buffer: {@link #length()} bytes of complete lines from index 0. Valid until the next record. */
    public byte[] bytes() {
        return batch;
    }

    /** Bytes of complete lines in the batch. */
    public int length() {
        return length;
    }

    /** Complete records in the batch. */
    public int records() {
        return records;
    }

    /** Empties the batch; the chain (sequence and head) goes on. */
    public void clear() {
        length = 0;
        records = 0;
        recordStart = 0;
    }

    /** The bytes of the record being built, from its opening brace to here (a copy), e.g. for a signature over them. */
    public byte[] recordSoFar() {
        return Arrays.copyOfRange(batch, recordStart, length);
    }

    /** The last record ended, as a line without its newline. */
    public String lastRecord() {
        return new String(batch, recordStart, length - 1 - recordStart, StandardCharsets.UTF_8);
    }

    /** Starts a record: {@code {"seq":N,"prev":"...","type":<typeLiteral>}; append fields with {@link #field}. */
    public RecordChain begin(byte[] typeLiteral) {
        recordStart = length;
        ensure(SEQ.length + LONG_MAX_CHARS + PREV.length + head.length + TYPE.length + typeLiteral.length);
        put(SEQ);
        putLong(nextSeq);
        put(PREV);
        put(head);
        put(TYPE);
        put(typeLiteral);
        return this;
    }

    public RecordChain field(byte[] key, long value) {
        ensure(key.length + LONG_MAX_CHARS);
        put(key);
        putLong(value);
        return this;
    }

    public RecordChain field(byte[] key, boolean value) {
        return field(key, value ? TRUE : FALSE);
    }

    public RecordChain field(byte[] key, String value) {
        ensure(key.length);
        put(key);
        return string(value);
    }

    /** Appends a field whose value is already encoded JSON ({@link #literal}, or a number list). */
    public RecordChain field(byte[] key, byte[] json) {
        ensure(key.length + json.length);
        put(key);
        put(json);
        return this;
    }

    /** Appends {@code value} as a string of lowercase hex digits without leading zeros, as {@link Long#toHexString}. */
    public RecordChain hexField(byte[] key, long value) {
        ensure(key.length + 2 + 16);
        put(key);
        batch[length++] = '"';
        int digits = value == 0 ? 1 : (Long.SIZE - Long.numberOfLeadingZeros(value) + 3) / 4;
        for (int p = length + digits - 1; p >= length; p--) {
            batch[p] = HEX_DIGITS[(int) (value & 15)];
            value >>>= 4;
        }
        length += digits;
        batch[length++] = '"';
        return this;
    }

    /** Appends a field name for a value built with {@link #raw} and {@link #number}. */
    public RecordChain key(byte[] key) {
        ensure(key.length);
        put(key);
        return this;
    }

    /** Appends bytes that are already encoded JSON (e.g. fields fixed for a writer's lifetime). */
    public RecordChain raw(byte[] json) {
        ensure(json.length);
        put(json);
        return this;
    }

    /** Appends one ASCII character of JSON structure ({@code [ ] , "}). */
    public RecordChain raw(char c) {
        ensure(1);
        batch[length++] = (byte) c;
        return this;
    }

    public RecordChain number(long value) {
        ensure(LONG_MAX_CHARS);
        putLong(value);
        return this;
    }

    /**
     * Appends a list entry {@code [a,b]}, or {@code [a,b,c]} when {@code c != 1}, preceded by
     * {@code ','} unless {@code first}: a page list's {@code [page, generation(, times)]} in one call.
     */
    public RecordChain entry(boolean first, int a, int b, int c) {
        ensure(5 + 3 * LONG_MAX_CHARS);
        if (!first) {
            batch[length++] = ',';
        }
        batch[length++] = '[';
        putLong(a);
        batch[length++] = ',';
        putLong(b);
        if (c != 1) {
            batch[length++] = ',';
            putLong(c);
        }
        batch[length++] = ']';
        return this;
    }

    /** Appends {@code s} as a JSON string literal in UTF-8 (an unpaired surrogate becomes '?', as {@link String#getBytes} does). */
    public RecordChain string(String s) {
        raw('"');
        escaped(s);
        return raw('"');
    }

    /** Appends the characters of {@code s} as they appear inside a JSON string literal, in UTF-8. */
    public RecordChain escaped(String s) {
        int n = s.length();
        ensure(6 * n); // one char encodes to at most 6 bytes (a control character's escape)
        byte[] b = batch;
        int p = length;
        for (int i = 0; i < n; i++) {
            char c = s.charAt(i);
            if (c < 0x80) {
                byte[] e = ESCAPES[c];
                if (e == null) {
                    b[p++] = (byte) c;
                } else {
                    System.arraycopy(e, 0, b, p, e.length);
                    p += e.length;
                }
            } else if (c < 0x800) {
                b[p++] = (byte) (0xC0 | c >> 6);
                b[p++] = (byte) (0x80 | c & 0x3F);
            } else if (Character.isHighSurrogate(c) && i + 1 < n && Character.isLowSurrogate(s.charAt(i + 1))) {
                int cp = Character.toCodePoint(c, s.charAt(++i));
                b[p++] = (byte) (0xF0 | cp >> 18);
                b[p++] = (byte) (0x80 | cp >> 12 & 0x3F);
                b[p++] = (byte) (0x80 | cp >> 6 & 0x3F);
                b[p++] = (byte) (0x80 | cp & 0x3F);
            } else if (Character.isSurrogate(c)) {
                b[p++] = '?';
            } else {
                b[p++] = (byte) (0xE0 | c >> 12);
                b[p++] = (byte) (0x80 | c >> 6 & 0x3F);
                b[p++] = (byte) (0x80 | c & 0x3F);
            }
        }
        length = p;
        return this;
    }

    /** Ends the record: hashes its body in place, appends the hash field and the newline, advances the chain. */
    public void end() {
        ensure(HASH_FIELD_BYTES.length + 2 * HASH_BYTES + 3);
        sha256.update(batch, recordStart, length - recordStart);
        try {
            sha256.digest(digest, 0, HASH_BYTES);
        } catch (DigestException e) {
            throw new IllegalStateException("SHA-256 cannot write its " + HASH_BYTES + "-byte digest", e);
        }
        put(HASH_FIELD_BYTES);
        for (int i = 0; i < HASH_BYTES; i++) {
            head[2 * i] = HEX_DIGITS[(digest[i] >> 4) & 15];
            head[2 * i + 1] = HEX_DIGITS[digest[i] & 15];
        }
        put(head);
        batch[length++] = '"';
        batch[length++] = '}';
        batch[length++] = '\n';
        nextSeq++;
        records++;
    }

    private void ensure(int bytes) {
        if (length + bytes > batch.length) {
            batch = Arrays.copyOf(batch, Math.max(2 * batch.length, length + bytes));
        }
    }

    private void put(byte[] b) {
        System.arraycopy(b, 0, batch, length, b.length);
        length += b.length;
    }

    /** Decimal digits of {@code v}, as {@link Long#toString(long)}; the caller ensured the room. */
    private void putLong(long v) {
        if (v == Long.MIN_VALUE) {
            put(MIN_LONG);
            return;
        }
        if (v < 0) {
            batch[length++] = '-';
            v = -v;
        }
        if (v < 10) {
            // Page lists are mostly small numbers: generations, counts.
            batch[length++] = (byte) ('0' + v);
            return;
        }
        int digits = decimalDigits(v);
        int p = length + digits;
        // Two digits per division: the timestamps every record carries have 13 or more.
        while (v >= Integer.MAX_VALUE) {
            long q = v / 100;
            int pair = 2 * (int) (v - 100 * q);
            batch[--p] = DIGIT_PAIRS[pair + 1];
            batch[--p] = DIGIT_PAIRS[pair];
            v = q;
        }
        int i = (int) v;
        while (i >= 100) {
            int q = i / 100;
            int pair = 2 * (i - 100 * q);
            batch[--p] = DIGIT_PAIRS[pair + 1];
            batch[--p] = DIGIT_PAIRS[pair];
            i = q;
        }
        if (i >= 10) {
            batch[--p] = DIGIT_PAIRS[2 * i + 1];
            batch[--p] = DIGIT_PAIRS[2 * i];
        } else {
            batch[--p] = (byte) ('0' + i);
        }
        length += digits;
    }

    /** Decimal digits of {@code v >= 0}: estimated from its bit length, corrected by one comparison. */
    private static int decimalDigits(long v) {
        int estimate = ((Long.SIZE - Long.numberOfLeadingZeros(v)) * 1233) >>> 12; // log10(2) ~ 1233 / 4096
        return estimate + (estimate < POWERS_OF_TEN.length && v >= POWERS_OF_TEN[estimate] ? 1 : 0);
    }
}
