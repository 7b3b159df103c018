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
import java.math.BigDecimal;
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
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(10, Double.NEGATIVE_INFINITY, false));
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(10, new BigDecimal("-0.1"), false));
        IllegalArgumentException tiny = assertThrows(IllegalArgumentException.class,
                () -> new AdmissionPolicy(10, new BigDecimal("1e-999999999"), false));
        assertEquals("headroomFraction must have at most 30 decimal places: 1E-999999999", tiny.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new AdmissionPolicy(10, new BigDecimal("0.5"), false).slotsToHold(-1));
        assertEquals(64, AdmissionLimits.compute(G, AdmissionPolicy.poolBound()).effectiveTokens());
    }

    /** 90 slots less 0.3 hold exactly 63 tokens; in doubles 90 * (1.0 - 0.3) is 62.99999999999999. */
    @Test
    void headroomArithmeticKeepsExactFits() {
        AdmissionPolicy p = new AdmissionPolicy(63, new BigDecimal("0.3"), true);
        assertEquals(63, p.holdsTokens(90), "an exact fit");
        assertEquals(62, p.holdsTokens(89), "one slot under: 62.3");
        assertEquals(63, p.holdsTokens(91), "one slot over: 63.7");
        assertEquals(90, p.slotsToHold(63));
        assertEquals(92, p.slotsToHold(64), "64 / 0.7 = 91.43");
        AdmissionPolicy ninety = new AdmissionPolicy(10, new BigDecimal("0.9"), true);
        assertEquals(10, ninety.holdsTokens(100), "in doubles 100 * (1.0 - 0.9) is 9.999999999999998");
        assertEquals(9, ninety.holdsTokens(99));
        assertEquals(100, ninety.slotsToHold(10));
        assertEquals(63, new AdmissionPolicy(63, 0.3, false).holdsTokens(90), "a double literal means the decimal it was written as");
        assertEquals(Long.MAX_VALUE, new AdmissionPolicy(1, new BigDecimal("0.5"), false).slotsToHold(Long.MAX_VALUE), "saturates");

        // 10 usable pages of 9 tokens: 90 slots.
        PoolGeometry ninetySlots = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(9).pageCount(11).build();
        AdmissionLimits fits = AdmissionLimits.compute(ninetySlots, new AdmissionPolicy(63, new BigDecimal("0.3"), true));
        assertEquals(63, fits.effectiveTokens());
        assertFalse(fits.isLowered());
        PoolTooSmallException over = assertThrows(PoolTooSmallException.class,
                () -> AdmissionLimits.compute(ninetySlots, new AdmissionPolicy(64, new BigDecimal("0.3"), true)));
        assertTrue(over.getMessage().contains("pool holds 63 tokens (90 token slots with 0.3 kept as headroom)"), over.getMessage());
    }

    /** {@code slotsToHold} is the exact inverse of {@code holdsTokens}: the fewest slots, never one too few. */
    @Test
    void slotsToHoldIsTheFewestSlotsThatHold() {
        for (String h : new String[] {"0", "0.1", "0.25", "0.3", "0.333", "0.7", "0.9", "0.99", "0.123456789"}) {
            AdmissionPolicy p = new AdmissionPolicy(1, new BigDecimal(h), false);
            for (long tokens = 0; tokens <= 300; tokens++) {
                long slots = p.slotsToHold(tokens);
                assertTrue(p.holdsTokens(slots) >= tokens, "headroom " + h + ": " + slots + " slots hold " + tokens);
                assertTrue(slots == 0 || p.holdsTokens(slots - 1) < tokens, "headroom " + h + ": " + (slots - 1) + " slots already hold "
                        + tokens);
            }
        }
    }
}
