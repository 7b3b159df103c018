package dev.kvshield.metrics;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * Serves a Micrometer registry in the Prometheus text format ({@code GET /metrics}) on the JDK's
 * HTTP server — no framework. With one allocator per tensor-parallel rank, each rank serves on
 * {@code basePort + rank} (its series carry the {@code rank} tag); {@link #writeTextFile} instead
 * writes the same text where a file-based collector (node_exporter's textfile collector) reads it.
 * Binds to loopback unless given another address.
 *
 * <p>Thread-safe; scrapes run on one server thread.
 */
public final class PrometheusEndpoint implements AutoCloseable {
    public static final String PATH = "/metrics";
    public static final String CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

    private final HttpServer server;

    private PrometheusEndpoint(HttpServer server) {
        this.server = server;
    }

    /**
     * Starts serving on {@code bind:(basePort + rank)}; {@code basePort} 0 picks an ephemeral port.
     *
     * @throws IOException if the port is taken, naming it
     */
    public static PrometheusEndpoint start(PrometheusMeterRegistry registry, InetAddress bind, int basePort, int rank)
            throws IOException {
        if (basePort < 0 || rank < 0 || basePort + rank > 65535) {
            throw new IllegalArgumentException("basePort + rank must be a port in [0, 65535]: basePort=" + basePort + " rank=" + rank);
        }
        int port = basePort == 0 ? 0 : basePort + rank;
        HttpServer server;
        try {
            server = HttpServer.create(new InetSocketAddress(bind, port), 16);
        } catch (IOException e) {
            throw new IOException("cannot serve metrics on " + bind.getHostAddress() + ":" + port + " (rank " + rank + "): " + e.getMessage(), e);
        }
        server.createContext("/", exchange -> handle(exchange, registry));
        server.start();
        return new PrometheusEndpoint(server);
    }

    /** {@link #start} on the loopback address. */
    public static PrometheusEndpoint startLoopback(PrometheusMeterRegistry registry, int basePort, int rank) throws IOException {
        return start(registry, InetAddress.getLoopbackAddress(), basePort, rank);
    }

    private static void handle(HttpExchange exchange, PrometheusMeterRegistry registry) throws IOException {
        try (exchange) {
            if (!PATH.equals(exchange.getRequestURI().getPath())) {
                exchange.sendResponseHeaders(404, -1);
                return;
            }
            if (!"GET".equals(exchange.getRequestMethod())) {
                exchange.getResponseHeaders().set("Allow", "GET");
                exchange.sendResponseHeaders(405, -1);
                return;
            }
            byte[] body = registry.scrape().getBytes(StandardCharsets.UTF_8);
            exchange.getResponseHeaders().set("Content-Type", CONTENT_TYPE);
            exchange.sendResponseHeaders(200, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(body);
            }
        }
    }

    /** The port actually bound. */
    public int port() {
        return server.getAddress().getPort();
    }

    public URI uri() {
        return URI.create("http://" + server.getAddress().getAddress().getHostAddress() + ":" + port() + PATH);
    }

    /**
     * Writes the registry's Prometheus text to {@code file} atomically (a temporary file beside it,
     * then a rename), for collectors that read files rather than scrape.
     */
    public static void writeTextFile(PrometheusMeterRegistry registry, Path file) throws IOException {
        Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
        Files.writeString(tmp, registry.scrape(), StandardCharsets.UTF_8);
        Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    @Override
    public void close() {
        server.stop(0);
    }
}
