package dev.kvshield.perf.report;

import dev.kvshield.keys.cipher.ChaCha20;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The machine a report's figures came from: every figure is labelled with it. {@code cipher} is the
 * ChaCha20 implementation this JVM runs ({@link ChaCha20#implementation()}): ENCRYPT's cost depends on it.
 */
public record MachineInfo(int cores, String cpu, String jdk, String os, long memoryBytes, String host, String cipher) {
    public static MachineInfo current() {
        String cpu = "unknown CPU";
        try {
            for (String line : Files.readAllLines(Path.of("/proc/cpuinfo"))) {
                if (line.startsWith("model name")) {
                    cpu = line.substring(line.indexOf(':') + 1).trim();
                    break;
                }
            }
        } catch (IOException | RuntimeException e) {
            // Not Linux, or not readable: keep "unknown CPU".
        }
        long memory = 0;
        if (java.lang.management.ManagementFactory.getOperatingSystemMXBean()
                instanceof com.sun.management.OperatingSystemMXBean os) {
            memory = os.getTotalMemorySize();
        }
        String host;
        try {
            host = java.net.InetAddress.getLocalHost().getHostName();
        } catch (IOException e) {
            host = "unknown host";
        }
        return new MachineInfo(Runtime.getRuntime().availableProcessors(), cpu,
                System.getProperty("java.vm.name") + " " + System.getProperty("java.runtime.version"),
                System.getProperty("os.name") + " " + System.getProperty("os.version") + " " + System.getProperty("os.arch"), memory,
                host, ChaCha20.implementation());
    }

    /** One line for figure captions: cores, CPU, JDK, OS, ChaCha20 implementation. */
    public String label() {
        return cores + " cores, " + cpu + ", " + jdk + ", " + os + ", ChaCha20 " + cipher;
    }

    public Map<String, Object> toJson() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("label", label());
        m.put("cores", cores);
        m.put("cpu", cpu);
        m.put("jdk", jdk);
        m.put("os", os);
        m.put("memoryBytes", memoryBytes);
        m.put("host", host);
        m.put("cipher", cipher);
        return m;
    }
}
