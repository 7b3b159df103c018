package dev.kvshield.bridge;

import dev.kvshield.cuda.CudaProbe;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.pool.KvPagePool;
import java.util.ArrayList;
import java.util.List;

/**
 * The start-up self-test the Python side runs in every scheduler process: the Java runtime is 25
 * or newer, the kvshield classes load, and native access (needed to wrap the engine's buffers) is
 * enabled. Also runnable as {@code java --enable-native-access=ALL-UNNAMED -cp ... dev.kvshield.bridge.SelfTest}.
 */
public final class SelfTest {
    /** The oldest Java feature release the bridge runs on. */
    public static final int MIN_JAVA = 25;

    private SelfTest() {}

    /**
     * Version lines (runtime, VM, kvshield jars, the host ChaCha20 implementation, whether a GPU is
     * usable); never key material or paths to secrets.
     */
    public static List<String> versions() {
        List<String> lines = new ArrayList<>();
        lines.add("java.runtime: " + System.getProperty("java.runtime.name") + " " + Runtime.version());
        lines.add("java.vm: " + System.getProperty("java.vm.name") + " " + System.getProperty("java.vm.version"));
        lines.add("java.home: " + System.getProperty("java.home"));
        lines.add("kvshield.allocator-api: " + versionOf(KvPagePool.class, "allocator-api"));
        lines.add("kvshield.sglang-bridge: " + versionOf(SelfTest.class, "sglang-bridge"));
        lines.add("kvshield.cuda-scrub: " + versionOf(CudaProbe.class, "cuda-scrub"));
        lines.add("chacha20: " + ChaCha20.implementation());
        CudaProbe.Result gpu = CudaProbe.probe();
        lines.add("cuda: " + (gpu.available() ? "usable, " : "not usable (host tensors only), ") + gpu.reason());
        return lines;
    }

    /**
     * Problems found, empty when the runtime can run the bridge.
     */
    public static List<String> problems() {
        List<String> problems = new ArrayList<>();
        int feature = Runtime.version().feature();
        if (feature < MIN_JAVA) {
            problems.add("Java " + feature + " is too old: the bridge needs Java " + MIN_JAVA + "+ (java.home="
                    + System.getProperty("java.home") + ")");
        }
        if (!SelfTest.class.getModule().isNativeAccessEnabled()) {
            problems.add("native access is not enabled for " + SelfTest.class.getModule()
                    + ": start the JVM with --enable-native-access=ALL-UNNAMED");
        }
        return problems;
    }

    private static String versionOf(Class<?> type, String artifact) {
        String resource = "/META-INF/maven/dev.kvshield/" + artifact + "/pom.properties";
        try (var in = type.getResourceAsStream(resource)) {
            if (in == null) {
                return "(classes, not a jar)";
            }
            java.util.Properties p = new java.util.Properties();
            p.load(in);
            return p.getProperty("version", "unknown");
        } catch (java.io.IOException e) {
            return "unreadable: " + e.getMessage();
        }
    }

    public static void main(String[] args) {
        versions().forEach(System.out::println);
        List<String> problems = problems();
        problems.forEach(p -> System.out.println("PROBLEM: " + p));
        System.out.println(problems.isEmpty() ? "self-test: ok" : "self-test: FAILED");
        System.exit(problems.isEmpty() ? 0 : 1);
    }
}
