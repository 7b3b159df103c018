package dev.kvshield.audit;

import dev.kvshield.audit.internal.RecordChain;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

/**
 * Checks an audit trail with nothing but the operator's pinned public key: the hash chain from
 * record 0, sequence numbers without gaps or reordering, every checkpoint's Ed25519 signature, and
 * that a final checkpoint seals the tail. Reports every problem and the first bad sequence number.
 */
public final class AuditVerifier {
    private AuditVerifier() {}

    /**
     * The outcome of a verification.
     *
     * @param firstBadSeq the lowest sequence number that is altered, missing, misplaced or
     *     unauthenticated; -1 if the trail verified
     */
    public record Report(boolean ok, long firstBadSeq, List<String> problems, long records, long checkpoints) {}

    public static Report verify(List<Path> paths, PublicKey pinned) throws IOException {
        return new Run(pinned).run(AuditLog.read(paths), List.of());
    }

    /**
     * Also checks that every checkpoint line shipped off the host ({@link CheckpointShipper}) is in
     * the log as shipped: a log truncated or rewritten after a checkpoint left the host fails even
     * while it is still open.
     */
    public static Report verify(List<Path> paths, PublicKey pinned, List<String> shippedCheckpoints) throws IOException {
        return new Run(pinned).run(AuditLog.read(paths), shippedCheckpoints);
    }

    private static final class Run {
        private final PublicKey pinned;
        private final String pinnedFingerprint;
        private final MessageDigest sha256 = RecordChain.sha256();
        private final List<String> problems = new ArrayList<>();
        private long firstBad = -1;
        private long expected;
        private String prev = RecordChain.GENESIS;
        private long records;
        private long checkpoints;
        private long lastCheckpointSeq = -1;
        private boolean sealed;

        Run(PublicKey pinned) {
            this.pinned = pinned;
            this.pinnedFingerprint = AuditKeys.fingerprint(pinned);
        }

        private static long seqOf(String line) {
            try {
                return dev.kvshield.audit.internal.Json.parseObject(line).get("seq") instanceof Long l ? l : 0;
            } catch (IllegalArgumentException e) {
                return 0;
            }
        }

        private void bad(long seq, String problem) {
            problems.add(problem);
            if (firstBad < 0 || seq < firstBad) {
                firstBad = seq;
            }
        }

        Report run(List<AuditLog.Line> lines, List<String> shipped) {
            java.util.Set<String> logged = new java.util.HashSet<>();
            for (AuditLog.Line line : lines) {
                logged.add(line.text());
            }
            for (String s : shipped) {
                if (!s.isBlank() && !logged.contains(s.strip())) {
                    long seq = seqOf(s);
                    bad(seq, "shipped checkpoint seq " + seq + " is not in the log as shipped (log truncated or rewritten after it left the host)");
                }
            }
            for (AuditLog.Line line : lines) {
                String where = line.file().getFileName() + ":" + line.lineNumber();
                if (!line.isRecord()) {
                    bad(expected, where + ": not an audit record (altered or foreign line) where seq " + expected + " was expected");
                    String body = RecordChain.bodyOf(line.text());
                    prev = body != null ? RecordChain.storedHashOf(line.text()) : prev;
                    expected++;
                    continue;
                }
                check(line, where);
            }
            if (records == 0) {
                bad(0, "no audit records: not an audit log");
            } else if (!sealed) {
                bad(expected, "tail is not sealed by a final checkpoint: records after seq " + (expected - 1)
                        + " are missing (truncated tail) or the trail was not closed; last signed checkpoint is seq "
                        + lastCheckpointSeq);
            }
            return new Report(firstBad < 0, firstBad, List.copyOf(problems), records, checkpoints);
        }

        private void check(AuditLog.Line line, String where) {
            records++;
            long seq = line.number("seq", -1);
            String type = line.type();
            if (sealed) {
                bad(expected, where + ": seq " + seq + " follows the final checkpoint");
            }
            // Position errors are charged to the position (the seq expected there): a forged seq field cannot move the blame.
            if (seq != expected) {
                if (expected == 0) {
                    bad(0, where + ": the trail starts at seq " + seq + ", not 0 (truncated head)");
                } else if (seq > expected) {
                    bad(expected, where + ": seq " + expected + ".." + (seq - 1) + " missing (removed records or file)");
                } else {
                    bad(expected, where + ": seq " + seq + " where seq " + expected + " was expected (reordered or duplicated)");
                }
            }
            String body = RecordChain.bodyOf(line.text());
            String stored = RecordChain.storedHashOf(line.text());
            if (!RecordChain.hashOf(sha256, body).equals(stored)) {
                bad(expected, where + ": seq " + seq + " was altered (its hash does not match its content)");
            }
            if (!prev.equals(line.string("prev"))) {
                bad(expected, where + ": seq " + seq + " does not chain to the record before it");
            }
            if (seq == 0 && !"open".equals(type)) {
                bad(0, where + ": record 0 is '" + type + "', not the trail's opening record");
            }
            if ("checkpoint".equals(type)) {
                checkpoint(line, where, seq, expected);
            }
            prev = stored;
            expected = seq + 1;
        }

        private void checkpoint(AuditLog.Line line, String where, long seq, long position) {
            checkpoints++;
            long upTo = line.number("upTo", -2);
            String head = line.string("head");
            String sig = line.string("sig");
            boolean valid = false;
            if (upTo == seq - 1 && head != null && head.equals(line.string("prev")) && sig != null) {
                try {
                    byte[] message = RecordChain.checkpointMessage(String.valueOf(line.string("pool")), line.number("rank", -1), upTo, head);
                    valid = AuditKeys.verify(pinned, message, Base64.getDecoder().decode(sig.getBytes(StandardCharsets.US_ASCII)));
                } catch (IllegalArgumentException e) {
                    valid = false;
                }
            }
            if (!valid) {
                bad(position, where + ": checkpoint seq " + seq + " does not verify under the pinned key " + pinnedFingerprint
                        + " (it names signer " + line.string("signer") + ")");
                return;
            }
            lastCheckpointSeq = seq;
            if (Boolean.TRUE.equals(line.fields().get("final"))) {
                sealed = true;
            }
        }
    }
}
