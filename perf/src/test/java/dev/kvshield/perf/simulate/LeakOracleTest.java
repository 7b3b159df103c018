package dev.kvshield.perf.simulate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Map;
import org.junit.jupiter.api.Test;

class LeakOracleTest {
    @Test
    void expectedOwnZeroAndNoiseAreNotLeaks() {
        LeakOracle oracle = new LeakOracle();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(64);
            Canary.fill(s, 2, 9, 0, 2, 0, 32);
            assertEquals(0, oracle.check(s, 2, 0, 32, 2, 9, 2, 9));
            assertEquals(0, oracle.check(s, 2, 0, 32, 2, 10, 2, 9), "a shared prefix written by request 9");
            s.fill((byte) 0);
            assertEquals(0, oracle.check(s, 2, 0, 32, 1, 1, 1, 1));
            s.set(ValueLayout.JAVA_LONG_UNALIGNED, 0, 0x1234_5678_9ABC_DEF0L);
            assertEquals(0, oracle.check(s, 2, 0, 32, 1, 1, 1, 1));
        }
        assertEquals(0, oracle.leakedBytes());
        assertEquals(0, oracle.leakedRequests());
        assertNull(oracle.firstLeak());
        assertEquals(16, oracle.noiseBytes());
    }

    @Test
    void anotherTenantsCanaryIsALeakAttributedToWhoWroteIt() {
        LeakOracle oracle = new LeakOracle();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(64);
            Canary.fill(s, 1, 41, 100, 2, 3, 32);
            assertEquals(64, oracle.check(s, 2, 3, 32, 4, 77, 4, 77));
        }
        assertEquals(64, oracle.leakedBytes());
        assertEquals(64, oracle.crossTenantBytes());
        assertEquals(1, oracle.leakedRequests());
        assertTrue(oracle.leakedTo(4, 77));
        assertFalse(oracle.leakedTo(1, 41));
        assertEquals(Map.of("tenant 1 -> tenant 4", 64L), oracle.flows());
        assertEquals(new LeakSample(1, 41, 4, 77, 100, 3), oracle.firstLeak());
    }

    @Test
    void anotherRequestOfTheSameTenantIsALeakToo() {
        LeakOracle oracle = new LeakOracle();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(16);
            Canary.fill(s, 3, 5, 0, 1, 0, 16);
            assertEquals(16, oracle.check(s, 1, 0, 16, 3, 6, 3, 6));
        }
        assertEquals(0, oracle.crossTenantBytes());
        assertEquals(Map.of("tenant 3 -> tenant 3", 16L), oracle.flows());
    }
}
