package dev.kvshield.bridge;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** With {@code metricsBasePort} set, each rank serves its pool's metrics on loopback port base + rank. */
class BridgeMetricsTest {
    static final PoolGeometry G = PoolGeometry.builder().mha(1, 1, 4, 2).pageSizeTokens(4).pageCount(9).build();

    @Test
    void eachRankServesItsPoolsMetricsOnBasePlusRank() throws Exception {
        int base;
        try (ServerSocket probe = new ServerSocket(0)) {
            base = probe.getLocalPort() - 1; // rank 1 lands on the port just found free
        }
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(G);
                SlotAllocator allocator = SlotAllocator.create(Map.of("metricsBasePort", Integer.toString(base), "rank", "1",
                        "poolId", "bridge-metrics"), G, memory)) {
            assertEquals(base + 1, allocator.metricsPort());
            HttpResponse<String> r = HttpClient.newHttpClient().send(
                    HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + (base + 1) + "/metrics")).build(),
                    HttpResponse.BodyHandlers.ofString());
            assertEquals(200, r.statusCode());
            assertTrue(r.body().contains("kvshield_pages{pool=\"bridge-metrics\",rank=\"1\",state=\"free\"} 8.0"), r.body());
        }
    }

    @Test
    void metricsAreOffByDefaultAndBadPortsAreRefused() throws Exception {
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(G); SlotAllocator allocator = SlotAllocator.create(Map.of(), G, memory)) {
            assertEquals(-1, allocator.metricsPort());
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> BridgeSettings.parse(Map.of("metricsBasePort", "65535", "rank", "3")));
        assertTrue(e.getMessage().contains("65535 + 3"), e.getMessage());
    }
}
