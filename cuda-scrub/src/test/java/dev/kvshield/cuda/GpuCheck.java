package dev.kvshield.cuda;

import static org.junit.platform.engine.discovery.DiscoverySelectors.selectClass;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.junit.platform.launcher.core.LauncherDiscoveryRequestBuilder;
import org.junit.platform.launcher.core.LauncherFactory;
import org.junit.platform.launcher.listeners.SummaryGeneratingListener;
import org.junit.platform.launcher.listeners.TestExecutionSummary;

/**
 * Entry point of the GPU bundle ({@code ./gpu-check [OUT_DIR]}): runs the GPU conformance and
 * kernel tests, then the GPU benchmarks, and writes {@code gpu-check.json} and a short
 * {@code summary.txt} into {@code OUT_DIR} (default {@code ./gpu-check-out}).
 *
 * <p>Exit status: 0 all tests passed and every release batch was one launch (benchmark goals are
 * reported, not enforced: a missed goal is a finding, not a broken build); 1 a test or a benchmark
 * failed, a batch took more than one launch, or the GPU is unusable (e.g. its driver is older than
 * the PTX needs; the message names both versions); 2 no usable GPU: the tests ran
 * and skipped with the reason, nothing was measured, and the message says why.
 */
public final class GpuCheck {
    private GpuCheck() {}

    public static void main(String[] args) throws IOException {
        Path out = Path.of(args.length > 0 ? args[0] : "gpu-check-out");
        Files.createDirectories(out);
        long startNanos = System.nanoTime();
        CudaProbe.Result probe = CudaProbe.probe();
        System.out.println("gpu-check: " + (probe.available() ? "GPU present (" + probe.reason() + ")" : "no GPU") + "; running GPU tests");
        SummaryGeneratingListener listener = new SummaryGeneratingListener();
        LauncherFactory.create().execute(LauncherDiscoveryRequestBuilder.request()
                .selectors(selectClass(CudaConformanceTest.class), selectClass(CudaKernelsTest.class),
                        selectClass(CudaSealerTest.class)).build(), listener);
        TestExecutionSummary tests = listener.getSummary();
        List<String> failures = new ArrayList<>();
        tests.getFailures().forEach(f -> failures.add(f.getTestIdentifier().getDisplayName() + ": " + f.getException()));
        String testsJson = "{\"found\": " + tests.getTestsFoundCount() + ", \"succeeded\": " + tests.getTestsSucceededCount()
                + ", \"failed\": " + tests.getTestsFailedCount() + ", \"skipped\": "
                + (tests.getTestsSkippedCount() + tests.getTestsAbortedCount()) + ", \"containersSkipped\": "
                + tests.getContainersSkippedCount() + ", \"failures\": ["
                + String.join(", ", failures.stream().map(GpuCheck::quote).toList()) + "]}";
        if (!probe.available()) {
            // The tests ran their class-level condition and skipped; nothing can be measured.
            String reason = "no usable GPU: " + probe.reason();
            write(out, "{\n  \"gpu\": false,\n  \"reason\": " + quote(reason) + ",\n  \"tests\": " + testsJson + "\n}\n",
                    "gpu-check: " + reason + "\ntests: skipped with that reason (" + tests.getTestsSkippedCount() + " tests, "
                            + tests.getContainersSkippedCount() + " classes and parameterised tests); nothing measured\n");
            System.err.println("gpu-check: " + reason + " (tests skipped, nothing measured; wrote "
                    + out.resolve("gpu-check.json") + ")");
            System.exit(2);
        }
        CudaDevice device;
        try {
            device = GpuTests.requireDevice();
        } catch (CudaException e) {
            // A GPU is there but unusable (e.g. a driver older than the PTX needs): say why, loudly.
            write(out, "{\n  \"gpu\": true,\n  \"error\": " + quote(e.getMessage()) + ",\n  \"tests\": " + testsJson + "\n}\n",
                    "gpu-check: " + e.getMessage() + "\n");
            System.err.println("gpu-check: " + e.getMessage());
            System.exit(1);
            return;
        }
        System.out.println("gpu-check: " + device + "; tests " + tests.getTestsSucceededCount() + " passed, "
                + tests.getTestsFailedCount() + " failed; running benchmarks");
        GpuBenchmarks bench = new GpuBenchmarks(device);
        String benchError = null;
        try {
            bench.run();
        } catch (RuntimeException e) {
            benchError = e.toString();
        }
        double seconds = (System.nanoTime() - startNanos) / 1e9;

        StringBuilder json = new StringBuilder("{\n");
        json.append("  \"gpu\": true,\n  \"device\": ").append(quote(device.name())).append(",\n");
        json.append("  \"driverCudaVersion\": ").append(quote(CudaDevice.cudaVersion(device.driverVersion()))).append(",\n");
        json.append("  \"tests\": ").append(testsJson).append(",\n");
        json.append("  \"launchesPerReleaseBatch\": ").append(bench.launchesPerBatch).append(",\n");
        json.append("  \"benchmarkError\": ").append(benchError == null ? "null" : quote(benchError)).append(",\n");
        json.append("  \"benchmarks\": [");
        StringBuilder summary = new StringBuilder();
        summary.append("gpu-check on ").append(device.name()).append(" (driver CUDA ")
                .append(CudaDevice.cudaVersion(device.driverVersion())).append(")\n");
        summary.append("tests: ").append(tests.getTestsSucceededCount()).append(" passed, ").append(tests.getTestsFailedCount())
                .append(" failed, ").append(tests.getTestsSkippedCount() + tests.getTestsAbortedCount()).append(" skipped\n");
        failures.forEach(f -> summary.append("  FAILED ").append(f).append('\n'));
        summary.append("launches per release batch: ").append(bench.launchesPerBatch).append(" (must be 1)\n");
        for (int i = 0; i < bench.results.size(); i++) {
            GpuBenchmarks.Result r = bench.results.get(i);
            String goal = r.goalRatio() > 0 ? String.format(Locale.ROOT, "%.2f", r.goalRatio()) : "null";
            json.append(i == 0 ? "\n" : ",\n").append(String.format(Locale.ROOT,
                    "    {\"name\": %s, \"bytes\": %d, \"wallBytesPerSecond\": %.4e, \"deviceBytesPerSecond\": %.4e, "
                            + "\"baseline\": %s, \"baselineWallBytesPerSecond\": %.4e, \"baselineDeviceBytesPerSecond\": %.4e, "
                            + "\"wallRatio\": %.4f, \"deviceRatio\": %.4f, \"goalRatio\": %s, \"goalOn\": \"%s\", \"goalMet\": %s}",
                    quote(r.name()), r.bytes(), r.rate().wallBytesPerSecond(), r.rate().deviceBytesPerSecond(), quote(r.baseline()),
                    r.baselineRate().wallBytesPerSecond(), r.baselineRate().deviceBytesPerSecond(), r.wallRatio(), r.deviceRatio(),
                    goal, r.goalOnDevice() ? "device" : "wall", r.goalMet()));
            summary.append(String.format(Locale.ROOT, "%s vs %s: device %.0f vs %.0f GB/s = %.3fx, wall %.0f vs %.0f GB/s = %.3fx%s%n",
                    r.name(), r.baseline(), r.rate().deviceBytesPerSecond() / 1e9, r.baselineRate().deviceBytesPerSecond() / 1e9,
                    r.deviceRatio(), r.rate().wallBytesPerSecond() / 1e9, r.baselineRate().wallBytesPerSecond() / 1e9, r.wallRatio(),
                    r.goalRatio() > 0 ? " (goal >= " + goal + " on " + (r.goalOnDevice() ? "device" : "wall") + " time: "
                            + (r.goalMet() ? "met" : "MISSED") + ")" : ""));
        }
        json.append("\n  ],\n  \"seconds\": ").append(String.format(Locale.ROOT, "%.1f", seconds)).append("\n}\n");
        if (benchError != null) {
            summary.append("benchmarks failed: ").append(benchError).append('\n');
        }
        summary.append(String.format(Locale.ROOT, "took %.1f s%n", seconds));
        write(out, json.toString(), summary.toString());
        System.out.print(summary);
        System.exit(tests.getTestsFailedCount() > 0 || tests.getTestsFoundCount() == 0 || benchError != null
                || bench.launchesPerBatch != 1 ? 1 : 0);
    }

    private static void write(Path out, String json, String summary) throws IOException {
        Files.writeString(out.resolve("gpu-check.json"), json, StandardCharsets.UTF_8);
        Files.writeString(out.resolve("summary.txt"), summary, StandardCharsets.UTF_8);
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
