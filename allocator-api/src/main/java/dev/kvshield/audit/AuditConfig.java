package dev.kvshield.audit;

import io.micrometer.core.instrument.MeterRegistry;
import java.util.ArrayList;
import java.util.List;

/**
 * Settings of an {@link AuditTrail}, validated once in {@link Builder#build()}. Immutable.
 *
 * <ul>
 *   <li>{@code sink} (required): where record lines go, e.g. {@link AuditSink#rotatingFiles}.
 *   <li>{@code signingKey} (required): the operator's Ed25519 key for checkpoints.
 *   <li>{@code checkpointEveryRecords} (default {@value #DEFAULT_CHECKPOINT_EVERY_RECORDS}): a signed
 *       checkpoint after at most this many records (at the step boundary that crosses it), and one at
 *       close. A record lists a run of like page events (a batch's pages), so a checkpoint covers
 *       many more events than records; an Ed25519 signature costs about a millisecond of the
 *       thread writing the batch, which is why this counts records, not events.
 *   <li>{@code checkpointEveryMillis} (default 0: off): also a signed checkpoint at the first step boundary at
 *       least this long after the last one that has records to cover, so a process killed without closing (an
 *       engine's shutdown often kills its workers) leaves at most that long of records unsigned.
 *   <li>{@code bufferRecords} (default {@value #DEFAULT_BUFFER_RECORDS}): runs of events, and
 *       distinct pages listed in them, buffered between step boundaries; a full buffer is written at once.
 *   <li>{@code handOffMinStepMicros} (default {@value #DEFAULT_HAND_OFF_MIN_STEP_MICROS}): after a
 *       step that lasted at least this long (from the hand-off before), the step's batch is encoded
 *       and written by the trail's writer thread while the pool runs the next one; after a shorter
 *       step it is written at the boundary: the next step would reach its boundary before the writer
 *       is done, and waking and waiting for it costs more than the overlap gains (AuditTrailBenchmark,
 *       ~50 µs steps: 19.4k steps/s written at the boundary, 16.2k handed off; the cost report's
 *       ms-long steps: COMPLIANCE 0.890 of stock written at the boundary, 0.914 handed off). 0 hands
 *       every batch off.
 *   <li>{@code readsRecorded} (default true): whether the pool's users read KV through it ({@code KvPagePool.read}), so the
 *       trail holds every read. False for an engine whose kernels read KV directly (the SGLang bridge): a request is
 *       then taken to read every page as it was handed out, and another tenant's slots still in a page it receives
 *       count as exposure ({@code foreignSlotsReceived}), since no read record can clear or convict it.
 *   <li>{@code shippers}: where checkpoint lines are also sent.
 *   <li>{@code meterRegistry}: for a detached trail; an attached trail uses its pool's registry.
 * </ul>
 */
public final class AuditConfig {
    public static final int DEFAULT_CHECKPOINT_EVERY_RECORDS = 10_000;
    public static final int DEFAULT_BUFFER_RECORDS = 16_384;
    public static final int DEFAULT_HAND_OFF_MIN_STEP_MICROS = 500;

    private final AuditSink sink;
    private final AuditKeys.SigningKey signingKey;
    private final int checkpointEveryRecords;
    private final long checkpointEveryMillis;
    private final int bufferRecords;
    private final int handOffMinStepMicros;
    private final boolean readsRecorded;
    private final List<CheckpointShipper> shippers;
    private final MeterRegistry meterRegistry;

    private AuditConfig(Builder b) {
        sink = b.sink;
        signingKey = b.signingKey;
        checkpointEveryRecords = b.checkpointEveryRecords;
        checkpointEveryMillis = b.checkpointEveryMillis;
        bufferRecords = b.bufferRecords;
        handOffMinStepMicros = b.handOffMinStepMicros;
        readsRecorded = b.readsRecorded;
        shippers = List.copyOf(b.shippers);
        meterRegistry = b.meterRegistry;
    }

    public static Builder builder() {
        return new Builder();
    }

    public AuditSink sink() {
        return sink;
    }

    public AuditKeys.SigningKey signingKey() {
        return signingKey;
    }

    public int checkpointEveryRecords() {
        return checkpointEveryRecords;
    }

    /** 0: checkpoints by record count and at close only. */
    public long checkpointEveryMillis() {
        return checkpointEveryMillis;
    }

    public int bufferRecords() {
        return bufferRecords;
    }

    public int handOffMinStepMicros() {
        return handOffMinStepMicros;
    }

    public boolean readsRecorded() {
        return readsRecorded;
    }

    public List<CheckpointShipper> shippers() {
        return shippers;
    }

    /** The registry for a detached trail, or null. */
    public MeterRegistry meterRegistry() {
        return meterRegistry;
    }

    public static final class Builder {
        private AuditSink sink;
        private AuditKeys.SigningKey signingKey;
        private int checkpointEveryRecords = DEFAULT_CHECKPOINT_EVERY_RECORDS;
        private long checkpointEveryMillis;
        private int bufferRecords = DEFAULT_BUFFER_RECORDS;
        private int handOffMinStepMicros = DEFAULT_HAND_OFF_MIN_STEP_MICROS;
        private boolean readsRecorded = true;
        private final List<CheckpointShipper> shippers = new ArrayList<>();
        private MeterRegistry meterRegistry;

        private Builder() {}

        public Builder sink(AuditSink sink) {
            this.sink = sink;
            return this;
        }

        public Builder signingKey(AuditKeys.SigningKey key) {
            this.signingKey = key;
            return this;
        }

        public Builder checkpointEveryRecords(int records) {
            this.checkpointEveryRecords = records;
            return this;
        }

        public Builder checkpointEveryMillis(long millis) {
            this.checkpointEveryMillis = millis;
            return this;
        }

        public Builder bufferRecords(int records) {
            this.bufferRecords = records;
            return this;
        }

        public Builder handOffMinStepMicros(int micros) {
            this.handOffMinStepMicros = micros;
            return this;
        }

        public Builder readsRecorded(boolean recorded) {
            this.readsRecorded = recorded;
            return this;
        }

        public Builder shipper(CheckpointShipper shipper) {
            if (shipper == null) {
                throw new IllegalArgumentException("shipper must not be null");
            }
            shippers.add(shipper);
            return this;
        }

        public Builder meterRegistry(MeterRegistry registry) {
            this.meterRegistry = registry;
            return this;
        }

        public AuditConfig build() {
            if (sink == null) {
                throw new IllegalArgumentException("an audit trail needs a sink (e.g. AuditSink.rotatingFiles(dir, prefix, maxFileBytes))");
            }
            if (signingKey == null) {
                throw new IllegalArgumentException("an audit trail needs the operator's signing key (AuditKeys.loadSigningKey)");
            }
            if (checkpointEveryRecords < 1) {
                throw new IllegalArgumentException("checkpointEveryRecords must be >= 1: checkpointEveryRecords=" + checkpointEveryRecords);
            }
            if (checkpointEveryMillis < 0) {
                throw new IllegalArgumentException("checkpointEveryMillis must be >= 0 (0: off): checkpointEveryMillis="
                        + checkpointEveryMillis);
            }
            if (bufferRecords < 16) {
                throw new IllegalArgumentException("bufferRecords must be >= 16: bufferRecords=" + bufferRecords);
            }
            if (handOffMinStepMicros < 0) {
                throw new IllegalArgumentException("handOffMinStepMicros must be >= 0: handOffMinStepMicros=" + handOffMinStepMicros);
            }
            return new AuditConfig(this);
        }
    }
}
