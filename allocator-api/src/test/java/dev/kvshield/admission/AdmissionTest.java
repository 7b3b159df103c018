package dev.kvshield.admission;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.Test;

/** The 2026 incident's first cause: an advertised context the pool cannot hold. */
class AdmissionTest {
    // 16 usable pages of 4 tokens: 64 token slots.
    static final PoolGeometry G = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(4).pageCount(17).build();

    @Test
    void aPoolThatCannotHoldTheAdvertisedContextLowersTheLimitLoudlyNamingBothNumbers() {
        StringBuilder log = new StringBuilder();
        Handler capture = new Handler() {
            @Override
            public void publish(LogRecord r) {
                log.append(r.getMessage()).append('\n');
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        Logger root = Logger.getLogger("");
        root.addHandler(capture);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(G);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(G).level(ProtectionLevel.ZERO)
                        .admission(new AdmissionPolicy(100, 0.25, false)).build(), memory)) {
            AdmissionLimits limits = pool.admission();
            assertEquals(100, limits.advertisedTokens());
            assertEquals(48, limits.poolHoldsTokens(), "64 slots with a quarter kept as headroom");
            assertEquals(48, limits.effectiveTokens());
            assertTrue(limits.isLowered());
            assertTrue(log.toString().contains("advertised 100 tokens, pool holds 48 tokens"), log.toString());
            pool.admit(48);
            RequestTooLongException e = assertThrows(RequestTooLongException.class, () -> pool.admit(49));
            assertEquals("request of 49 tokens exceeds the effective limit of 48 tokens (advertised 100)", e.getMessage());
            assertThrows(IllegalArgumentException.class, () -> pool.admit(-1));
            assertEquals(0, pool.snapshot().owned(), "nothing reserved for a rejected request");
        } finally {
            root.removeHandler(capture);
        }
    }

    @Test
    void strictAdmissionRefusesToStart() {
        PoolTooSmallException e = assertThrows(PoolTooSmallException.class,
                () -> AdmissionLimits.compute(G, new AdmissionPolicy(1_048_576, 0.1, true)));
        assertTrue(e.getMessage().contains("advertised context 1048576 tokens") && e.getMessage().contains("pool holds 57 tokens")
                && e.getMessage().contains("strict"), e.getMessage());
    }

    @Test
    void bothSidesOfAHandoffMustAgree() {
        AdmissionLimits prefill = AdmissionLimits.compute(G, new AdmissionPolicy(40, 0, false));
        AdmissionLimits decode = AdmissionLimits.compute(G, new AdmissionPolicy(60, 0, false));
        assertFalse(prefill.isLowered());
        prefill.checkAgrees(40);
        LimitMismatchException e = assertThrows(LimitMismatchException.class, () -> prefill.checkAgrees(decode.effectiveTokens()));
        assertEquals("effective request limits disagree: local 40 tokens, peer 60 tokens", e.getMessage());
    }

    @Test
    void policyValuesAreValidated() {
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(0, 0, false));
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(10, 1.0, false));
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(10, Double.NaN, false));
        assertEquals(64, AdmissionLimits.compute(G, AdmissionPolicy.poolBound()).effectiveTokens());
    }
}
