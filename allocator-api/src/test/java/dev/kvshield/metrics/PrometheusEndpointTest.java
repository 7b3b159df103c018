package dev.kvshield.metrics;

import dev.kvshield.lease.LeaseKind;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.audit.AuditConfig;
import dev.kvshield.audit.AuditKeys;
import dev.kvshield.audit.AuditSink;
import dev.kvshield.audit.AuditTrail;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import dev.kvshield.tenant.Owners;
import dev.kvshield.testing.TestPools;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Scrapes the Prometheus endpoint over loopback and parses the text format strictly. */
class PrometheusEndpointTest {
    /** The exposed names of every documented meter (Prometheus adds unit and _total suffixes). */
    static final List<String> DOCUMENTED = List.of("kvshield_pages", "kvshield_pages_allocated_pages_total",
            "kvshield_pages_released_pages_total", "kvshield_allocations_none_calls_total", "kvshield_pages_protected_pages_total",
            "kvshield_bytes_protected_bytes_total", "kvshield_protection_time_seconds_count", "kvshield_protection_time_seconds_sum",
            "kvshield_protection_time_seconds_max", "kvshield_rejections_calls_total", "kvshield_read_before_write_calls_total",
            "kvshield_protection_failures_pages_total", "kvshield_verify_failures_pages_total", "kvshield_reclaims_pages_total",
            "kvshield_listener_failures_events_total", "kvshield_admission_limit_tokens", "kvshield_audit_records_total",
            "kvshield_audit_alarms_pages_total", "kvshield_audit_checkpoints_total", "kvshield_audit_ship_failures_checkpoints_total",
            "kvshield_tenant_pages_owned_pages");
    private static final Pattern SAMPLE = Pattern.compile("([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{([^}]*)\\})? (\\S+)");
    private static final Pattern LABEL = Pattern.compile("([a-zA-Z_][a-zA-Z0-9_]*)=\"((?:[^\"\\\\]|\\\\.)*)\"");

    @TempDir
    Path dir;

    record Sample(String name, Map<String, String> labels, double value) {}

    /** Parses Prometheus text format 0.0.4; fails on any line that is neither comment nor sample. */
    static List<Sample> parse(String text) {
        Map<String, String> types = new HashMap<>();
        List<Sample> samples = new java.util.ArrayList<>();
        for (String line : text.split("\n")) {
            if (line.isEmpty()) {
                continue;
            }
            if (line.startsWith("# TYPE ")) {
                String[] p = line.split(" ");
                assertTrue(Set.of("counter", "gauge", "summary", "histogram", "untyped").contains(p[3]), line);
                types.put(p[2], p[3]);
                continue;
            }
            if (line.startsWith("#")) {
                continue;
            }
            Matcher m = SAMPLE.matcher(line);
            assertTrue(m.matches(), () -> "not a Prometheus sample line: " + line);
            Map<String, String> labels = new HashMap<>();
            if (m.group(3) != null && !m.group(3).isEmpty()) {
                Matcher l = LABEL.matcher(m.group(3));
                int end = 0;
                while (l.find()) {
                    labels.put(l.group(1), l.group(2));
                    end = l.end();
                }
                assertTrue(end > 0, line);
            }
            samples.add(new Sample(m.group(1), labels, Double.parseDouble(m.group(4))));
        }
        assertFalse(types.isEmpty(), "no TYPE lines");
        return samples;
    }

    private static String get(URI uri) throws IOException, InterruptedException {
        try (HttpClient client = HttpClient.newHttpClient()) {
            HttpResponse<String> r = client.send(HttpRequest.newBuilder(uri).GET().build(), HttpResponse.BodyHandlers.ofString());
            assertEquals(200, r.statusCode());
            assertEquals(PrometheusEndpoint.CONTENT_TYPE, r.headers().firstValue("Content-Type").orElse(""));
            return r.body();
        }
    }

    @Test
    void servesParseablePrometheusTextWithTheDocumentedNamesAndOptInTenantSeries() throws Exception {
        PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        PoolGeometry g = TestPools.tinyGeometry(9);
        int rank = 1;
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(g);
                KvPagePool pool = KvPagePool.create(PoolConfig.builder(g).level(ProtectionLevel.COMPLIANCE).poolId("p").rank(rank)
                        .meterRegistry(registry).build(), memory)) {
            AuditTrail trail = AuditTrail.attach(pool, AuditConfig.builder()
                    .sink(AuditSink.rotatingFiles(dir, "audit", 1 << 20)).signingKey(AuditKeys.generateInMemory()).build());
            int alice = pool.tenants().register("alice");
            int bob = pool.tenants().register("bob");
            TenantMetrics.register(registry, "p", rank, Set.of("alice"), name -> pool.ownedBy(pool.tenants().idOf(name)));
            long[] h = new long[3];
            pool.allocate(alice, Owners.request(1), LeaseKind.OWNER, 3, h, 0);
            pool.allocate(bob, Owners.request(2), LeaseKind.OWNER, 1, h, 0);
            pool.endStep();
            // Gauges must survive a collection: Micrometer holds gauge state weakly.
            System.gc();
            try (PrometheusEndpoint endpoint = PrometheusEndpoint.startLoopback(registry, 0, 0)) {
                assertEquals("127.0.0.1", endpoint.uri().getHost());
                List<Sample> samples = parse(get(endpoint.uri()));
                Set<String> names = new java.util.TreeSet<>();
                samples.forEach(s -> names.add(s.name()));
                for (String documented : DOCUMENTED) {
                    assertTrue(names.contains(documented), () -> documented + " missing from " + names);
                }
                for (Sample s : samples) {
                    if (s.name().startsWith("kvshield_")) {
                        assertEquals("1", s.labels().get("rank"), () -> s + " must carry its rank");
                    }
                }
                List<Sample> tenant = samples.stream().filter(s -> s.name().equals("kvshield_tenant_pages_owned_pages")).toList();
                assertEquals(1, tenant.size(), "only opted-in tenants get series");
                assertEquals("alice", tenant.getFirst().labels().get("tenant"));
                assertEquals(3.0, tenant.getFirst().value());
                double owned = samples.stream().filter(s -> s.name().equals("kvshield_pages") && "owned".equals(s.labels().get("state")))
                        .findFirst().orElseThrow().value();
                assertEquals(4.0, owned);
                try (HttpClient client = HttpClient.newHttpClient()) {
                    URI other = URI.create(endpoint.uri().toString().replace("/metrics", "/other"));
                    assertEquals(404, client.send(HttpRequest.newBuilder(other).build(), HttpResponse.BodyHandlers.discarding()).statusCode());
                }
            }
            trail.close();
        }
    }

    @Test
    void eachRankServesOnBasePortPlusRank() throws Exception {
        PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        int free;
        try (ServerSocket probe = new ServerSocket(0)) {
            free = probe.getLocalPort();
        }
        try (PrometheusEndpoint rank2 = PrometheusEndpoint.startLoopback(registry, free - 2, 2)) {
            assertEquals(free, rank2.port());
            IOException taken = assertThrows(IOException.class, () -> PrometheusEndpoint.startLoopback(registry, free - 2, 2));
            assertTrue(taken.getMessage().contains(":" + free) && taken.getMessage().contains("rank 2"), taken.getMessage());
        }
    }

    @Test
    void writesTheSameTextForFileCollectors() throws IOException {
        PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        TenantMetrics.register(registry, "p", 0, Set.of("alice"), name -> 5);
        Path file = dir.resolve("kvshield.prom");
        PrometheusEndpoint.writeTextFile(registry, file);
        List<Sample> samples = parse(Files.readString(file));
        assertEquals(5.0, samples.stream().filter(s -> s.name().equals("kvshield_tenant_pages_owned_pages")).findFirst().orElseThrow().value());
        assertThrows(IllegalArgumentException.class, () -> TenantMetrics.register(registry, "p", 0,
                java.util.stream.IntStream.range(0, TenantMetrics.MAX_OPTED_IN + 1).mapToObj(i -> "t" + i)
                        .collect(java.util.stream.Collectors.toSet()), n -> 0));
    }
}
