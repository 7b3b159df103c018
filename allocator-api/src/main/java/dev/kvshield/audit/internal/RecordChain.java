package dev.kvshield.audit.internal;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
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
 * <p>Not thread-safe: one chain per writer, used under its owner's lock.
 */
public final class RecordChain {
    public static final String GENESIS = "0".repeat(64);
    public static final String HASH_FIELD = ",\"hash\":\"";
    private static final HexFormat HEX = HexFormat.of();

    private final MessageDigest sha256 = sha256();
    private final StringBuilder line = new StringBuilder(512);
    private long nextSeq;
    private String head = GENESIS;

    public static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("the JDK has no SHA-256", e);
        }
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

    /** The bytes a checkpoint signs: the chain head after record {@code upTo} of one pool's rank. */
    public static byte[] checkpointMessage(String pool, long rank, long upTo, String head) {
        return ("kvshield-audit-checkpoint-v1|" + pool + "|" + rank + "|" + upTo + "|" + head).getBytes(StandardCharsets.UTF_8);
    }

    public long nextSeq() {
        return nextSeq;
    }

    /** The hash of the last record ended, or {@link #GENESIS}. */
    public String head() {
        return head;
    }

    /** Starts a record: {@code {"seq":N,"prev":"...","type":"..."}; append fields with {@link #field}. */
    public RecordChain begin(String type) {
        line.setLength(0);
        line.append("{\"seq\":").append(nextSeq).append(",\"prev\":\"").append(head).append("\",\"type\":\"").append(type)
                .append('"');
        return this;
    }

    public RecordChain field(String name, long value) {
        line.append(",\"").append(name).append("\":").append(value);
        return this;
    }

    public RecordChain field(String name, String value) {
        line.append(",\"").append(name).append("\":");
        Json.string(line, value);
        return this;
    }

    public RecordChain field(String name, boolean value) {
        line.append(",\"").append(name).append("\":").append(value);
        return this;
    }

    /** Appends a field whose value is already JSON. */
    public RecordChain rawField(String name, CharSequence json) {
        line.append(",\"").append(name).append("\":").append(json);
        return this;
    }

    /** Ends the record, advances the chain and returns the complete line (without newline). */
    public String end() {
        String body = line.toString();
        head = hashOf(sha256, body);
        nextSeq++;
        return body + HASH_FIELD + head + "\"}";
    }
}
