package dev.kvshield.audit;

import dev.kvshield.audit.internal.Json;
import dev.kvshield.audit.internal.RecordChain;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.util.ArrayList;
import java.util.Base64;
import java.util.EnumSet;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Checks one audit trail — one boot of one pool's rank, in one or more rotated files — with nothing
 * but the operator's pinned public key, and reports every problem and the first bad sequence number:
 *
 * <ul>
 *   <li>the chain: every record's hash, its link to the record before it from record 0 (the
 *       trail's opening record), sequence numbers without gaps or reordering;
 *   <li>every checkpoint's Ed25519 signature, which covers all of the checkpoint's fields (its
 *       {@code sig} is its last field): a checkpoint altered or re-marked as final fails;
 *   <li>that a final checkpoint seals the tail, and nothing follows it: a cut trail fails;
 *   <li>the trail: the opening record is of format {@value AuditTrail#FORMAT} and names a trail id,
 *       every record names the same one (files of two boots spliced together fail, naming both),
 *       and it is the trail the operator expects, if given;
 *   <li>with shipped checkpoints (collected off the host): every one of this trail is in the log as
 *       shipped, and no newer trail of the same pool and rank shipped after it (an older boot's
 *       complete trail put in place of the current one fails) unless the operator named this trail.
 * </ul>
 *
 * Format-1 trails are refused: their checkpoints signed four fields only, so a cut tail re-marked as
 * final verified (issue 15).
 */
public final class AuditVerifier {
    private static final String SIG_FIELD = RecordChain.SIG_FIELD;

    /** The files of a pool's trail ({@link AuditSink#poolTrailPrefix}, then the file number): pool id, rank. */
    private static final Pattern POOL_TRAIL_FILE = Pattern.compile("audit-(.+)-r(\\d+)-boot\\d+-\\d{6}\\.jsonl");

    private AuditVerifier() {}

    /**
     * The checks, each stopping its own kinds of tampering. Package-private so a test can plant a
     * verifier missing one ({@link #verifySkipping}) and see its attack pass: the planted-bug twins.
     * The public methods always run every check.
     */
    enum Check {
        CHAIN,
        SIGNATURE,
        SEAL,
        TRAIL,
        SHIPPED
    }

    /**
     * The outcome of a verification.
     *
     * @param firstBadSeq the lowest sequence number that is altered, missing, misplaced or
     *     unauthenticated (0 when the whole trail is the wrong one); -1 if the trail verified
     * @param trail the id of the trail the files hold (from its first record), or null if none
     */
    public record Report(boolean ok, long firstBadSeq, List<String> problems, long records, long checkpoints, String trail) {}

    public static Report verify(List<Path> paths, PublicKey pinned) throws IOException {
        return verify(paths, pinned, List.of(), null);
    }

    /**
     * Also checks the checkpoint lines shipped off the host ({@link CheckpointShipper}): a log
     * truncated or rewritten after a checkpoint left the host fails even while it is still open.
     */
    public static Report verify(List<Path> paths, PublicKey pinned, List<String> shippedCheckpoints) throws IOException {
        return verify(paths, pinned, shippedCheckpoints, null);
    }

    /**
     * As {@link #verify(List, PublicKey, List)}, and the files must hold trail {@code expectedTrail}
     * (null: any; with shipped checkpoints, then the newest trail shipped for this pool and rank).
     */
    public static Report verify(List<Path> paths, PublicKey pinned, List<String> shippedCheckpoints, String expectedTrail)
            throws IOException {
        return new Run(pinned, EnumSet.allOf(Check.class), expectedTrail).run(AuditLog.read(paths), shippedCheckpoints);
    }

    /** A planted verifier without check {@code skipped}, for the tests that prove each check is needed. */
    static Report verifySkipping(List<Path> paths, PublicKey pinned, Check skipped) throws IOException {
        return verifySkipping(paths, pinned, skipped, List.of(), null);
    }

    static Report verifySkipping(List<Path> paths, PublicKey pinned, Check skipped, List<String> shippedCheckpoints,
            String expectedTrail) throws IOException {
        EnumSet<Check> checks = EnumSet.allOf(Check.class);
        checks.remove(skipped);
        return new Run(pinned, checks, expectedTrail).run(AuditLog.read(paths), shippedCheckpoints);
    }

    private static final class Run {
        private final PublicKey pinned;
        private final String pinnedFingerprint;
        private final Set<Check> checks;
        private final String expectedTrail;
        private final MessageDigest sha256 = RecordChain.sha256();
        private final List<String> problems = new ArrayList<>();
        private long firstBad = -1;
        private long expected;
        private String prev = RecordChain.GENESIS;
        private long records;
        private long checkpoints;
        private long lastCheckpointSeq = -1;
        private boolean sealed;
        /** A record after the final checkpoint was reported (once: the records after it would repeat it). */
        private boolean afterFinal;
        /** The trail's id, pool and rank, from its first record. */
        private String trail;
        private String pool;
        private long rank;
        /** The last trail other than {@link #trail} reported, so a spliced-in stretch is reported once. */
        private String foreign;
        /** Files whose name was checked against their records ({@link #misnamed}). */
        private final Set<Path> namedFiles = new HashSet<>();

        Run(PublicKey pinned, Set<Check> checks, String expectedTrail) {
            this.pinned = pinned;
            this.pinnedFingerprint = AuditKeys.fingerprint(pinned);
            this.checks = checks;
            this.expectedTrail = expectedTrail;
        }

        private void bad(long seq, String problem) {
            problems.add(problem);
            if (firstBad < 0 || seq < firstBad) {
                firstBad = seq;
            }
        }

        Report run(List<AuditLog.Line> lines, List<String> shipped) {
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
            } else if (!sealed && checks.contains(Check.SEAL)) {
                bad(expected, "tail is not sealed by a final checkpoint: records after seq " + (expected - 1)
                        + " are missing (truncated tail) or the trail was not closed; last signed checkpoint is seq "
                        + lastCheckpointSeq);
            }
            if (trail != null && expectedTrail != null && !expectedTrail.equals(trail) && checks.contains(Check.TRAIL)) {
                bad(0, "these files are trail " + trail + ", not the expected trail " + expectedTrail);
            }
            if (trail != null && checks.contains(Check.SHIPPED)) {
                shipped(lines, shipped);
            }
            return new Report(firstBad < 0, firstBad, List.copyOf(problems), records, checkpoints, trail);
        }

        private void check(AuditLog.Line line, String where) {
            records++;
            long seq = line.number("seq", -1);
            String type = line.type();
            if (sealed && !afterFinal && checks.contains(Check.SEAL)) {
                bad(expected, where + ": seq " + seq + " follows the final checkpoint (so does every record after it)");
                afterFinal = true;
            }
            String stored = RecordChain.storedHashOf(line.text());
            if (records == 1) {
                trail = line.string("trail");
                pool = line.string("pool");
                rank = line.number("rank", -1);
            }
            if (checks.contains(Check.CHAIN)) {
                chain(line, where, seq, type, stored);
            }
            if (checks.contains(Check.TRAIL)) {
                trail(line, where, seq, type);
            }
            if ("checkpoint".equals(type)) {
                checkpoint(line, where, seq, expected);
            }
            prev = stored;
            expected = seq + 1;
        }

        private void chain(AuditLog.Line line, String where, long seq, String type, String stored) {
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
            if (!RecordChain.hashOf(sha256, RecordChain.bodyOf(line.text())).equals(stored)) {
                bad(expected, where + ": seq " + seq + " was altered (its hash does not match its content)");
            }
            if (!prev.equals(line.string("prev"))) {
                bad(expected, where + ": seq " + seq + " does not chain to the record before it");
            }
            if (seq == 0 && !"open".equals(type)) {
                bad(0, where + ": record 0 is '" + type + "', not the trail's opening record");
            }
        }

        private void trail(AuditLog.Line line, String where, long seq, String type) {
            String id = line.string("trail");
            if (namedFiles.add(line.file())) {
                misnamed(line, where);
            }
            if (records == 1) {
                if ("open".equals(type)) {
                    long format = line.number("format", 1);
                    if (format != AuditTrail.FORMAT) {
                        bad(0, where + ": trail format " + format + " is not accepted: this verifier reads format "
                                + AuditTrail.FORMAT + " (format 1's checkpoints do not sign their final flag or a trail id, so a"
                                + " tail cut and re-marked as final cannot be told from a closed one)");
                    } else if (id == null || !id.matches("[0-9a-f]{32}")) {
                        bad(0, where + ": the opening record names no trail id (32 hex digits): " + id);
                    }
                }
                return;
            }
            if ("open".equals(type)) {
                bad(expected, where + ": an opening record of trail " + id + " inside trail " + trail
                        + ": files of two boots are spliced (verify each boot's files on their own)");
                foreign = id;
            } else if (!Objects.equals(id, trail) && !Objects.equals(id, foreign)) {
                bad(expected, where + ": seq " + seq + " belongs to trail " + id + ", not trail " + trail
                        + " (opened at seq 0): files of two boots are spliced");
                foreign = id;
            }
        }

        /**
         * A file named as a pool's trail ({@link AuditSink#poolTrailPrefix}, e.g. the SGLang bridge's)
         * must hold that pool and rank's records: another pool's complete trail copied over these files verifies on its
         * own, and with shipped checkpoints too (they are checked per pool), while the trail the names promise is gone.
         */
        private void misnamed(AuditLog.Line line, String where) {
            Matcher m = POOL_TRAIL_FILE.matcher(String.valueOf(line.file().getFileName()));
            String pool = line.string("pool");
            long rank = line.number("rank", -1);
            if (m.matches() && !(m.group(1).equals(pool) && m.group(2).equals(Long.toString(rank)))) {
                bad(0, where + ": the file is named for pool " + m.group(1) + " rank " + m.group(2) + " but holds pool " + pool
                        + " rank " + rank + "'s records (another pool's trail in its place)");
            }
        }

        private void checkpoint(AuditLog.Line line, String where, long seq, long position) {
            checkpoints++;
            if (checks.contains(Check.SIGNATURE)) {
                String why = signatureProblem(line, seq);
                if (why != null) {
                    bad(position, where + ": checkpoint seq " + seq + ": " + why);
                    return;
                }
            }
            lastCheckpointSeq = seq;
            if (Boolean.TRUE.equals(line.fields().get("final"))) {
                sealed = true;
            }
        }

        /** Why the checkpoint does not authenticate the chain up to it, or null if it does. */
        private String signatureProblem(AuditLog.Line line, long seq) {
            String body = RecordChain.bodyOf(line.text());
            String sig = line.string("sig");
            int at = body.lastIndexOf(SIG_FIELD);
            if (sig == null || at < 0 || !body.endsWith("\"") || !body.substring(at + SIG_FIELD.length(), body.length() - 1).equals(sig)) {
                return "its signature (sig) is missing or not its last field, so it does not sign every field before it";
            }
            String head = line.string("head");
            if (line.number("upTo", -2) != seq - 1 || head == null || !head.equals(line.string("prev"))) {
                return "its upTo and head do not name the record before it";
            }
            boolean valid;
            try {
                byte[] message = RecordChain.checkpointMessage(body.substring(0, at).getBytes(StandardCharsets.UTF_8));
                valid = AuditKeys.verify(pinned, message, Base64.getDecoder().decode(sig.getBytes(StandardCharsets.US_ASCII)));
            } catch (IllegalArgumentException e) {
                valid = false;
            }
            return valid ? null : "its signature over its fields does not verify under the pinned key " + pinnedFingerprint
                    + " (altered, re-marked as final or not, or signed by another key; it names signer " + line.string("signer") + ")";
        }

        /**
         * Shipped checkpoints of this trail must be in the log as shipped; one of another trail of
         * the same pool and rank shipped after this trail's last means these files are not the
         * newest boot's, unless the operator named this trail.
         */
        private void shipped(List<AuditLog.Line> lines, List<String> shipped) {
            Set<String> logged = new HashSet<>();
            for (AuditLog.Line line : lines) {
                logged.add(line.text());
            }
            int lastOwn = -1;
            int lastOther = -1;
            String other = null;
            for (int i = 0; i < shipped.size(); i++) {
                String s = shipped.get(i).strip();
                if (s.isEmpty()) {
                    continue;
                }
                Map<String, Object> f;
                try {
                    f = Json.parseObject(s);
                } catch (IllegalArgumentException e) {
                    bad(0, "shipped line " + (i + 1) + " is not a checkpoint record: " + e.getMessage());
                    continue;
                }
                long seq = f.get("seq") instanceof Long l ? l : 0;
                if (trail.equals(f.get("trail"))) {
                    lastOwn = i;
                    if (!logged.contains(s)) {
                        bad(seq, "shipped checkpoint seq " + seq + " of trail " + trail
                                + " is not in the log as shipped (log truncated or rewritten after it left the host)");
                    }
                } else if (Objects.equals(pool, f.get("pool")) && Long.valueOf(rank).equals(f.get("rank"))) {
                    lastOther = i;
                    other = String.valueOf(f.get("trail"));
                }
            }
            if (lastOther > lastOwn && expectedTrail == null) {
                bad(0, "trail " + other + " of pool " + pool + " rank " + rank + " shipped checkpoints after trail " + trail
                        + (lastOwn < 0 ? " shipped none" : "'s last") + ": a newer boot's trail exists and these files are an older"
                        + " one (verify it on purpose with --trail " + trail + ")");
            }
        }
    }
}
