package dev.kvshield.audit;

import dev.kvshield.claims.ClaimKind;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.function.LongSupplier;

/**
 * A reproducible trail: a fixed signing key, a fixed clock, tenant names that need every kind of
 * JSON escaping and UTF-8 encoding, and every event type, written to small rotating files.
 */
final class GoldenTrail {
    /** Rotation limit: the trail spreads over several files. */
    static final long MAX_FILE_BYTES = 2048;
    static final int CHECKPOINT_EVERY_RECORDS = 15;
    /** Quotes, backslash, control characters, 2-, 3- and 4-byte UTF-8. */
    static final String ESCAPED_NAME = "ålice \"q\" \\ \t\n\r\u0001\u001f/ é中😀";
    /** An unpaired surrogate: UTF-8 encoding writes '?' for it. */
    static final String LONE_SURROGATE_NAME = "lone\uD800x";
    private static final String[] NAMES = {ESCAPED_NAME, "bob", LONE_SURROGATE_NAME};
    /** The golden trail's id (a real trail mints 128 random bits). */
    static final String TRAIL_ID = "901dc0de0000000000000000c0ffee15";

    private GoldenTrail() {}

    /** The fixed test-only signing key (a resource), copied with owner-only permissions as loading demands. */
    static AuditKeys.SigningKey key(Path dir) throws IOException {
        Path file = dir.resolve(AuditKeys.PRIVATE_FILE);
        try (InputStream in = GoldenTrail.class.getResourceAsStream("golden-signing.key")) {
            Files.write(file, in.readAllBytes());
        }
        Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-------"));
        return AuditKeys.loadSigningKey(file);
    }

    /** Writes the golden scenario's trail to {@code sink}, signed by {@code key}, and closes the trail. */
    static void write(AuditSink sink, AuditKeys.SigningKey key) {
        long[] nanos = {1_000_000_000L};
        LongSupplier clock = () -> nanos[0] += 1_234_567;
        AuditConfig config = AuditConfig.builder().sink(sink).signingKey(key).checkpointEveryRecords(CHECKPOINT_EVERY_RECORDS).build();
        AuditTrail.Scope scope = new AuditTrail.Scope("gold\"en\\pool", 3, 4, 4, ProtectionLevel.COMPLIANCE, t -> NAMES[t]);
        AuditTrail trail = AuditTrail.detached(config, scope, clock, 1_700_000_000_000L, TRAIL_ID);
        long alice = Owners.request(7);
        long bob = Owners.request(8);
        long noOwner = -1;
        trail.onPageEvent(PageEventType.ALLOCATE, 0, 1, 0, alice, 0);
        trail.onPageEvent(PageEventType.WRITE, 0, 1, 0, alice, 3);
        trail.onPageEvent(PageEventType.READ, 0, 1, 0, alice, 4);
        trail.onPageEvent(PageEventType.ALLOCATE, 1, 1, 1, bob, 0);
        trail.onPageEvent(PageEventType.WRITE, 1, 1, 1, bob, 4);
        trail.onPageEvent(PageEventType.READER_ADDED, 1, 1, 0, alice, 7);
        trail.onPageEvent(PageEventType.READ, 1, 1, 0, alice, 2);
        trail.onPageEvent(PageEventType.READER_REMOVED, 1, 1, 0, alice, 7);
        trail.onPageEvent(PageEventType.READ, 1, 1, 0, alice, (1L << 32) | 3);
        trail.onPageEvent(PageEventType.OWNERSHIP_TRANSFER, 1, 1, 1, Owners.namespace(5), bob);
        trail.onClaimEvent(PageEventType.CLAIM_TAKEN, 0, 1, 0, alice, 0xDEAD_BEEFL, ClaimKind.READER, 42);
        trail.onClaimEvent(PageEventType.CLAIM_DROPPED, 0, 1, 0, alice, 0xDEAD_BEEFL, ClaimKind.WRITER, -3);
        trail.onPageEvent(PageEventType.CLAIM_FENCED, 0, 1, 0, alice, -1L);
        trail.onStepBoundary(1);
        trail.onPageEvent(PageEventType.RELEASE, 0, 1, 0, alice, ReleaseReason.FINISHED.ordinal());
        trail.onPageEvent(PageEventType.RELEASE, 1, 1, 1, Owners.namespace(5), 99);
        trail.onPageEvent(PageEventType.PROTECT_ISSUED, 0, 1, -1, noOwner, ProtectionLevel.COMPLIANCE.ordinal());
        trail.onPageEvent(PageEventType.PROTECT_DONE, 0, 2, -1, noOwner, ProtectionLevel.COMPLIANCE.ordinal());
        trail.onPageEvent(PageEventType.PROTECT_FAILED, 1, 2, -1, noOwner, 17);
        trail.onPageEvent(PageEventType.VERIFY_FAILED, 0, 2, -1, noOwner, ProtectionLevel.COMPLIANCE.ordinal());
        trail.onPageEvent(PageEventType.SEAL, 2, 4, 0, alice, 5);
        trail.onPageEvent(PageEventType.RECLAIM, 2, 5, 2, Owners.request(9), 6);
        trail.onPageEvent(PageEventType.SHRED, 2, 5, -1, noOwner, 7);
        trail.onPageEvent(PageEventType.FREE, 3, 1, -1, noOwner, 0);
        trail.onPageEvent(PageEventType.RETIRE, 0, 2, -1, noOwner, RetireReason.VERIFY_FAILED.ordinal());
        for (PageEventType type : PageEventType.values()) {
            if (type.isRejection()) {
                trail.onPageEvent(type, 3, 1, 1, bob, 0x1234_0000_0002L);
            }
        }
        trail.onPageEvent(PageEventType.REJECT_STALE, -1, 0, 1, bob, Long.MIN_VALUE);
        trail.requestFinished(0, 7, RequestOutcome.COMPLETED);
        trail.requestFinished(1, 8, RequestOutcome.ABORTED);
        trail.requestFinished(2, 9, RequestOutcome.TIMED_OUT);
        trail.onStepBoundary(2);
        batchStep(trail);
        trail.onStepBoundary(Long.MAX_VALUE);
        trail.close();
    }

    /**
     * A step as the pool emits a batch: one run per type (allocate, write, read), a page read once
     * per buffer (a repeat counted), a read run split where exposure changes (page 2's last slots
     * were never written), protect-done and free in lockstep per page (two runs, not six records),
     * then a page listed by a later open run coming again (a new run, so its order is kept).
     */
    private static void batchStep(AuditTrail trail) {
        long carol = Owners.request(10);
        for (int p = 0; p < 3; p++) {
            trail.onPageEvent(PageEventType.ALLOCATE, p, 6, 2, carol, 0);
        }
        for (int p = 0; p < 3; p++) {
            trail.onPageEvent(PageEventType.WRITE, p, 6, 2, carol, p < 2 ? 4 : 2);
        }
        for (int p = 0; p < 3; p++) {
            for (int buffer = 0; buffer < 2; buffer++) {
                trail.onPageEvent(PageEventType.READ, p, 6, 2, carol, 4);
            }
        }
        trail.onPageEvent(PageEventType.RELEASE, 0, 7, 2, carol, ReleaseReason.FINISHED.ordinal());
        for (int p = 0; p < 3; p++) {
            trail.onPageEvent(PageEventType.PROTECT_DONE, p, 7, 2, Owners.NOBODY, ProtectionLevel.COMPLIANCE.ordinal());
            trail.onPageEvent(PageEventType.FREE, p, 7, -1, Owners.NOBODY, 0);
        }
        trail.onPageEvent(PageEventType.PROTECT_DONE, 0, 7, 2, Owners.NOBODY, ProtectionLevel.COMPLIANCE.ordinal());
        trail.requestFinished(2, 10, RequestOutcome.COMPLETED);
    }
}
