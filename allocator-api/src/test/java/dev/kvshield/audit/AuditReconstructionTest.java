package dev.kvshield.audit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.internal.Json;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Records list runs of page events, yet every event a real pool emitted comes back from the trail:
 * per page, the same events (type, generation, tenant, owner) in the same order, from the records
 * ({@link AuditLog.Line#pages()}) and from {@code audit page}; and the records are far fewer than
 * the events. The twin drops one record from the trail read back: the comparison must see it.
 */
class AuditReconstructionTest {
    @TempDir
    Path dir;

    /** One page event as the pool emitted it, or as rebuilt from a record. */
    private record Event(String type, long gen, long tenant, long owner) {}

    /** Records what the pool emits, in order, per page. */
    private static final class Recorder implements PageEventListener {
        final Map<Long, List<Event>> byPage = new TreeMap<>();
        int events;

        @Override
        public void onPageEvent(PageEventType type, int page, int generation, int tenant, long owner, long detail) {
            long ownerId = Owners.isValid(owner) ? Owners.id(owner) : -1;
            byPage.computeIfAbsent((long) page, k -> new ArrayList<>())
                    .add(new Event(type.name().toLowerCase(Locale.ROOT), generation, tenant, ownerId));
            events++;
        }
    }

    /** Every page event the records list, per page, in record order. */
    private static Map<Long, List<Event>> rebuilt(List<AuditLog.Line> lines) {
        Map<Long, List<Event>> byPage = new TreeMap<>();
        for (AuditLog.Line l : lines) {
            long owner = l.number("req", l.number("ns", -1));
            for (AuditLog.PageEntry p : l.pages()) {
                for (long t = 0; t < p.times(); t++) {
                    byPage.computeIfAbsent(p.page(), k -> new ArrayList<>()).add(new Event(l.type(), p.generation(), l.number("tenant", -1),
                            owner));
                }
            }
        }
        return byPage;
    }

    @Test
    void everyPageEventOfARealPoolIsRebuiltFromFewerRecords() throws IOException {
        Path trailDir = dir.resolve("trail");
        Recorder recorder = new Recorder();
        try (TestPools t = TestPools.create(9, ProtectionLevel.COMPLIANCE)) {
            AuditTrail trail = AuditTrail.attach(t.pool, AuditFixtures.config(trailDir, AuditKeys.generateInMemory(), 1 << 20).build());
            t.pool.addListener(recorder);
            AuditFixtures.runScenario(t.pool, trail, 12);
            trail.close();
            assertEquals(recorder.events, trail.pageEventsWritten());
        }
        List<AuditLog.Line> lines = AuditLog.read(List.of(trailDir));
        // The scenario's batches are two pages: each type's events of a batch share one record.
        assertEquals(recorder.events / 2, lines.stream().filter(l -> !l.pages().isEmpty()).count(), "records listing page events");
        assertEquals(recorder.byPage, rebuilt(lines));

        // audit page: one JSON object per event of that page, in order.
        for (long page : recorder.byPage.keySet()) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            assertEquals(0, AuditTool.run(new String[] {"page", Long.toString(page), "--json", trailDir.toString()},
                    new PrintStream(out, true, StandardCharsets.UTF_8), new PrintStream(new ByteArrayOutputStream())));
            @SuppressWarnings("unchecked")
            List<Map<String, Object>> events = (List<Map<String, Object>>) Json.parseObject("{\"a\":" + out.toString(StandardCharsets.UTF_8)
                    .strip() + "}").get("a");
            List<Event> printed = new ArrayList<>();
            for (Map<String, Object> e : events) {
                assertEquals(page, e.get("page"));
                printed.add(new Event((String) e.get("type"), (Long) e.get("gen"), e.get("tenant") instanceof Long x ? x : -1,
                        e.get("req") instanceof Long r ? r : e.get("ns") instanceof Long n ? n : -1));
            }
            assertEquals(recorder.byPage.get(page), printed, "page " + page);
        }

        // Twin: a trail read back without one of its multi-page records is not the pool's history.
        List<AuditLog.Line> missingOne = new ArrayList<>(lines);
        assertTrue(missingOne.remove(lines.stream().filter(l -> l.pages().size() > 1).findFirst().orElseThrow()));
        assertNotEquals(recorder.byPage, rebuilt(missingOne));
    }
}
