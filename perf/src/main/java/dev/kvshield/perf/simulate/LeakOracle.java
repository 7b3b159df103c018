package dev.kvshield.perf.simulate;

import java.lang.foreign.MemorySegment;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;

/**
 * Checks every byte a request reads: the expected writer's canary (its own, or its tenant's shared
 * prefix), the reader's own canary, zero and noise (ciphertext) are fine; another request's or
 * tenant's canary is a leak, counted per cell with who leaked to whom.
 *
 * <p>Not thread-safe: one simulation thread feeds it.
 */
public final class LeakOracle {
    private long leakedBytes;
    private long crossTenantBytes;
    private long noiseBytes;
    private final Set<Long> leakedReaders = new HashSet<>();
    private final Map<String, Long> flows = new LinkedHashMap<>();
    private LeakSample first;

    /**
     * Checks {@code tokens} token slots of {@code buffer} read by {@code (readerTenant,
     * readerRequest)} that should hold what {@code (expectedTenant, expectedWriter)} wrote.
     *
     * <p>Implementation notes: a cell whose first word names the expected writer or the reader is no
     * leak whatever its second word holds, so it is not classified further (no check hash): reads
     * of the right data, nearly every cell, cost one load and two compares. Such a cell is
     * counted neither as canary nor as {@linkplain #noiseBytes() noise}.
     *
     * @return the leaked bytes found in this read
     */
    public long check(MemorySegment data, int tokens, int buffer, int bytesPerToken, int readerTenant, long readerRequest,
            int expectedTenant, long expectedWriter) {
        int cells = bytesPerToken / Canary.CELL_BYTES;
        long expectedWord = Canary.word0(expectedTenant, expectedWriter);
        long ownWord = Canary.word0(readerTenant, readerRequest);
        long leaked = 0;
        long at = 0;
        for (int t = 0; t < tokens; t++) {
            for (int c = 0; c < cells; c++, at += Canary.CELL_BYTES) {
                long word = Canary.firstWord(data, at);
                if (word == expectedWord || word == ownWord) {
                    continue;
                }
                int kind = Canary.classify(data, at, buffer, c);
                if (kind == Canary.NOISE) {
                    noiseBytes += Canary.CELL_BYTES;
                } else if (kind == Canary.CANARY) {
                    int tenant = Canary.tenantOf(data, at);
                    long request = Canary.requestOf(data, at);
                    boolean expected = tenant == expectedTenant && request == expectedWriter;
                    boolean own = tenant == readerTenant && request == readerRequest;
                    if (!expected && !own) {
                        leaked += Canary.CELL_BYTES;
                        record(tenant, request, readerTenant, readerRequest, Canary.positionOf(data, at), buffer);
                    }
                }
            }
        }
        leakedBytes += leaked;
        return leaked;
    }

    private void record(int fromTenant, long fromRequest, int toTenant, long toRequest, int position, int buffer) {
        if (first == null) {
            first = new LeakSample(fromTenant, fromRequest, toTenant, toRequest, position, buffer);
        }
        if (fromTenant != toTenant) {
            crossTenantBytes += Canary.CELL_BYTES;
        }
        leakedReaders.add(((long) toTenant << 48) | toRequest);
        flows.merge("tenant " + fromTenant + " -> tenant " + toTenant, (long) Canary.CELL_BYTES, Long::sum);
    }

    public long leakedBytes() {
        return leakedBytes;
    }

    /** Leaked bytes whose writer is another tenant than the reader. */
    public long crossTenantBytes() {
        return crossTenantBytes;
    }

    /** Bytes that were neither zero nor a canary (ciphertext or garbage): not leaks. */
    public long noiseBytes() {
        return noiseBytes;
    }

    /** Requests that read at least one leaked byte. */
    public int leakedRequests() {
        return leakedReaders.size();
    }

    /** True if {@code (tenant, request)} read a leaked byte. */
    public boolean leakedTo(int tenant, long request) {
        return leakedReaders.contains(((long) tenant << 48) | request);
    }

    /** Leaked bytes per "tenant A -> tenant B", in first-seen order. */
    public Map<String, Long> flows() {
        return Map.copyOf(flows);
    }

    /** The first leak seen, or {@code null}. */
    public LeakSample firstLeak() {
        return first;
    }
}
