package dev.kvshield.perf.workload;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.perf.testing.SimFixtures;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class TraceCsvTest {
    @Test
    void aWrittenTraceReadsBackEqual(@TempDir Path dir) {
        Trace trace = SimFixtures.tinyTrace(SimFixtures.SEED);
        Path file = dir.resolve("t.csv");
        TraceCsv.write(trace, file);
        Trace back = TraceCsv.read(file, 4);
        assertEquals(trace.requests(), back.requests());
        assertEquals(trace.tenants(), back.tenants());
    }

    @Test
    void theSameSpecGivesTheSameTraceAndAnotherSeedAnother() {
        assertEquals(SimFixtures.tinyTrace(3).requests(), SimFixtures.tinyTrace(3).requests());
        assertTrue(!SimFixtures.tinyTrace(3).requests().equals(SimFixtures.tinyTrace(4).requests()));
    }

    @Test
    void errorsNameTheLineAndTheValue(@TempDir Path dir) throws IOException {
        Path file = dir.resolve("bad.csv");
        Files.writeString(file, TraceCsv.HEADER + "\n0,0,0,10,5,6,-1,false\n");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> TraceCsv.read(file, 4));
        assertTrue(e.getMessage().contains("bad.csv:2") && e.getMessage().contains("prefix_tokens=6"), e.getMessage());
        Files.writeString(file, "id,tenant\n");
        e = assertThrows(IllegalArgumentException.class, () -> TraceCsv.read(file, 4));
        assertTrue(e.getMessage().contains("expected the header"), e.getMessage());
    }

    @Test
    void distributionsParseAndRejectWithTheAllowedForms() {
        assertEquals("lognormal:384:0.6", LengthDistribution.parse("lognormal:384:0.6").toString());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> LengthDistribution.parse("normal:3"));
        assertTrue(e.getMessage().contains("allowed: fixed:N, uniform:MIN:MAX, lognormal:MEDIAN:SIGMA"), e.getMessage());
    }
}
