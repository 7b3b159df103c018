package dev.kvshield.pool;

import dev.kvshield.admission.AdmissionPolicy;
import dev.kvshield.audit.PageEventListener;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.handle.PageHandles;
import dev.kvshield.lease.LeaseIds;
import dev.kvshield.lease.LeaseTable;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.quarantine.QuarantineMode;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * Everything a pool is built from, validated once in {@link Builder#build()}. Immutable.
 *
 * <p>Defaults: level {@code ZERO}, synchronous quarantine, release lag 0 steps, pool id
 * {@code "pool-0"}, rank 0, {@code maxClaims = pageCount} (at least 1024), {@code maxLeases = 4 *
 * pageCount + maxClaims} (every hold: owners, cache namespaces, readers, deferred frees, claims;
 * at least {@code 1024 + maxClaims}), admission bound by the pool only, protection timeout 60 s, a
 * private {@link SimpleMeterRegistry}.
 */
public final class PoolConfig {
    private final PoolGeometry geometry;
    private final ProtectionLevel level;
    private final QuarantineMode quarantineMode;
    private final int releaseLagSteps;
    private final String poolId;
    private final int rank;
    private final int maxLeases;
    private final int maxClaims;
    private final AdmissionPolicy admission;
    private final PageSealerFactory sealer;
    private final MeterRegistry meterRegistry;
    private final List<PageEventListener> listeners;
    private final long protectionTimeoutNanos;
    private final int initialGeneration;
    private final long firstLeaseSerial;

    private PoolConfig(Builder b) {
        geometry = b.geometry;
        level = b.level;
        quarantineMode = b.quarantineMode;
        releaseLagSteps = b.releaseLagSteps;
        poolId = b.poolId;
        rank = b.rank;
        long pages = b.geometry.pageCount();
        long defaultClaims = Math.max(1024L, pages);
        maxLeases = b.maxLeases > 0 ? b.maxLeases
                : (int) Math.min(LeaseTable.MAX_CAPACITY, Math.max(1024L, 4L * pages) + (b.maxClaims > 0 ? b.maxClaims : defaultClaims));
        maxClaims = b.maxClaims > 0 ? b.maxClaims : (int) Math.min(maxLeases, defaultClaims);
        if (maxClaims > maxLeases) {
            throw new IllegalArgumentException("maxClaims " + maxClaims + " exceeds maxLeases " + maxLeases
                    + ": every claim is a lease");
        }
        admission = b.admission;
        sealer = b.sealer;
        meterRegistry = b.meterRegistry != null ? b.meterRegistry : new SimpleMeterRegistry();
        listeners = List.copyOf(b.listeners);
        protectionTimeoutNanos = b.protectionTimeout.toNanos();
        initialGeneration = b.initialGeneration;
        firstLeaseSerial = b.firstLeaseSerial;
    }

    public static Builder builder(PoolGeometry geometry) {
        return new Builder(geometry);
    }

    public PoolGeometry geometry() {
        return geometry;
    }

    public ProtectionLevel level() {
        return level;
    }

    public QuarantineMode quarantineMode() {
        return quarantineMode;
    }

    public int releaseLagSteps() {
        return releaseLagSteps;
    }

    public String poolId() {
        return poolId;
    }

    public int rank() {
        return rank;
    }

    /** Most holds (leases) live at once: owners, cache namespaces, readers, reservations, deferred frees, claims. */
    public int maxLeases() {
        return maxLeases;
    }

    /** Most claims live or fenced at once (each keeps a bitset of the slots it wrote). */
    public int maxClaims() {
        return maxClaims;
    }

    public AdmissionPolicy admission() {
        return admission;
    }

    /** The sealer factory, or {@code null} when no key source is configured. */
    public PageSealerFactory sealer() {
        return sealer;
    }

    public MeterRegistry meterRegistry() {
        return meterRegistry;
    }

    public List<PageEventListener> listeners() {
        return listeners;
    }

    public long protectionTimeoutNanos() {
        return protectionTimeoutNanos;
    }

    public int initialGeneration() {
        return initialGeneration;
    }

    /** The first lease serial the pool mints (1 outside tests of id exhaustion; see {@link LeaseIds}). */
    public long firstLeaseSerial() {
        return firstLeaseSerial;
    }

    /** Collects settings; not thread-safe. */
    public static final class Builder {
        private final PoolGeometry geometry;
        private ProtectionLevel level = ProtectionLevel.ZERO;
        private QuarantineMode quarantineMode = QuarantineMode.SYNCHRONOUS;
        private int releaseLagSteps;
        private String poolId = "pool-0";
        private int rank;
        private int maxLeases;
        private int maxClaims;
        private AdmissionPolicy admission = AdmissionPolicy.poolBound();
        private PageSealerFactory sealer;
        private MeterRegistry meterRegistry;
        private final List<PageEventListener> listeners = new ArrayList<>();
        private Duration protectionTimeout = Duration.ofSeconds(60);
        private int initialGeneration = PageHandles.FIRST_GENERATION;
        private long firstLeaseSerial = 1;

        private Builder(PoolGeometry geometry) {
            if (geometry == null) {
                throw new IllegalArgumentException("geometry is required");
            }
            this.geometry = geometry;
        }

        /** The pool's default protection level (tenants may override). */
        public Builder level(ProtectionLevel level) {
            this.level = level;
            return this;
        }

        public Builder quarantineMode(QuarantineMode mode) {
            this.quarantineMode = mode;
            return this;
        }

        /**
         * Steps a released page's protection may take before the boundary waits for it: pages whose
         * protection was queued in step {@code s} become available at the boundary ending step
         * {@code s + releaseLagSteps}. 0 (the default) makes them available at the next boundary.
         */
        public Builder releaseLagSteps(int steps) {
            this.releaseLagSteps = steps;
            return this;
        }

        /** Identity of the pool in metrics, audit and key derivation. */
        public Builder poolId(String poolId) {
            this.poolId = poolId;
            return this;
        }

        /** Tensor-parallel rank of this pool's allocator. */
        public Builder rank(int rank) {
            this.rank = rank;
            return this;
        }

        /** Most holds live at once (0: the default, {@code 4 * pageCount}). */
        public Builder maxLeases(int maxLeases) {
            this.maxLeases = maxLeases;
            return this;
        }

        /** Most claims live or fenced at once (0: the default, {@code pageCount}). */
        public Builder maxClaims(int maxClaims) {
            this.maxClaims = maxClaims;
            return this;
        }

        public Builder admission(AdmissionPolicy admission) {
            this.admission = admission;
            return this;
        }

        /** The key source for {@code ENCRYPT}; without one, choosing ENCRYPT anywhere fails. */
        public Builder sealer(PageSealerFactory sealer) {
            this.sealer = sealer;
            return this;
        }

        public Builder meterRegistry(MeterRegistry registry) {
            this.meterRegistry = registry;
            return this;
        }

        public Builder listener(PageEventListener listener) {
            if (listener == null) {
                throw new IllegalArgumentException("listener must not be null");
            }
            listeners.add(listener);
            return this;
        }

        /** How long a step boundary waits for a queued protection batch before failing loudly. */
        public Builder protectionTimeout(Duration timeout) {
            this.protectionTimeout = timeout;
            return this;
        }

        /**
         * Starts every page at this generation instead of 1. For tests of generation exhaustion only:
         * a pool near {@link PageHandles#MAX_GENERATION} retires pages quickly.
         */
        public Builder testingInitialGeneration(int generation) {
            this.initialGeneration = generation;
            return this;
        }

        /**
         * Starts the lease counter at {@code serial} instead of 1. For tests of id exhaustion only: a
         * pool near {@link LeaseIds#maxSerial()} runs out of ids quickly and must say so, never wrap.
         */
        public Builder testingFirstLeaseSerial(long serial) {
            this.firstLeaseSerial = serial;
            return this;
        }

        public PoolConfig build() {
            if (level == null || quarantineMode == null || admission == null || protectionTimeout == null) {
                throw new IllegalArgumentException("level, quarantineMode, admission and protectionTimeout must not be null");
            }
            if (releaseLagSteps < 0 || releaseLagSteps > 1024) {
                throw new IllegalArgumentException("releaseLagSteps must be in [0, 1024]: " + releaseLagSteps);
            }
            if (poolId == null || poolId.isBlank() || poolId.length() > 128) {
                throw new IllegalArgumentException("poolId must be 1..128 non-blank characters: '" + poolId + "'");
            }
            if (rank < 0) {
                throw new IllegalArgumentException("rank must be >= 0: " + rank);
            }
            if (maxLeases < 0 || maxLeases > LeaseTable.MAX_CAPACITY || maxClaims < 0 || (maxLeases > 0 && maxClaims > maxLeases)) {
                throw new IllegalArgumentException("maxLeases must be in [0, " + LeaseTable.MAX_CAPACITY + "] and maxClaims in [0, maxLeases] (0 = default):"
                        + " maxLeases=" + maxLeases + " maxClaims=" + maxClaims);
            }
            LeaseIds ids = new LeaseIds(geometry.pageCount());
            if (firstLeaseSerial < 1 || firstLeaseSerial > ids.maxSerial()) {
                throw new IllegalArgumentException("first lease serial must be in [1, " + ids.maxSerial() + "]: " + firstLeaseSerial);
            }
            if (protectionTimeout.isNegative() || protectionTimeout.isZero()) {
                throw new IllegalArgumentException("protectionTimeout must be positive: " + protectionTimeout);
            }
            if (initialGeneration < PageHandles.FIRST_GENERATION || initialGeneration >= PageHandles.MAX_GENERATION) {
                throw new IllegalArgumentException("initial generation must be in [" + PageHandles.FIRST_GENERATION + ", "
                        + PageHandles.MAX_GENERATION + "): " + initialGeneration);
            }
            if (level.needsKeySource() && sealer == null) {
                throw new IllegalArgumentException(ProtectionLevel.NO_SEALER_MESSAGE);
            }
            return new PoolConfig(this);
        }
    }
}
