package dev.kvshield.perf.replay;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.testing.TestXorSealer;
import java.util.stream.Stream;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Every named incident: under stock it leaks (the replay can see the threat), under every kvshield
 * level no response carries another request's data and the offending request ends in an error.
 */
class IncidentReplayTest {
    static final PageSealerFactory SEALER = ctx -> new TestXorSealer(ctx.memory());

    static Stream<Arguments> incidentsAndLevels() {
        return Incidents.all().stream().flatMap(i -> Stream.of(Level.values()).map(l -> Arguments.of(i.name(), l)));
    }

    @ParameterizedTest(name = "{0} under {1}")
    @MethodSource("incidentsAndLevels")
    void stockLeaksAndEveryKvshieldLevelFailsTheOffenderInstead(String name, Level level) {
        IncidentResult r = Incidents.named(name).replay(level, SEALER);
        assertEquals(r.requests(), r.completed() + r.errors() + (level == Level.STOCK ? 0 : 0), r.toString());
        if (level == Level.STOCK) {
            assertTrue(r.leakedResponses() > 0, "stock must leak, or the replay cannot see the threat: " + r);
            assertTrue(r.leakedBytes() > 0);
            assertNotNull(r.firstLeak());
            assertTrue(r.firstLeak().fromTenant() != r.firstLeak().toTenant(), "a cross-tenant leak: " + r.firstLeak());
        } else {
            assertEquals(0, r.leakedResponses(), r.toString());
            assertEquals(0, r.leakedBytes(), r.toString());
            assertTrue(r.errors() >= 1, "the offending request ends in an error: " + r);
        }
    }
}
