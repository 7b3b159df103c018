package dev.kvshield.perf;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * The architecture as a test: dependencies point one way (allocator-api &lt;- tenant-keys &lt;-
 * cuda-scrub &lt;- sglang-bridge &lt;- perf), {@code internal} packages stay inside their module,
 * only tenant-keys touches Bouncy Castle and only cuda-scrub touches JCuda. Reads the main sources
 * of every module in the repository.
 */
class ModuleBoundariesTest {
    /** Module directory, the package root it owns, and the package roots it must never import. */
    record Module(String dir, String root, List<String> forbidden) {}

    static final List<Module> MODULES = List.of(
            new Module("allocator-api", "dev.kvshield.", List.of("dev.kvshield.keys", "dev.kvshield.cuda", "dev.kvshield.bridge",
                    "dev.kvshield.perf", "org.bouncycastle", "jcuda")),
            new Module("tenant-keys", "dev.kvshield.keys", List.of("dev.kvshield.cuda", "dev.kvshield.bridge", "dev.kvshield.perf",
                    "jcuda")),
            new Module("cuda-scrub", "dev.kvshield.cuda", List.of("dev.kvshield.bridge", "dev.kvshield.perf", "org.bouncycastle")),
            new Module("sglang-bridge", "dev.kvshield.bridge", List.of("dev.kvshield.perf", "org.bouncycastle", "jcuda")),
            new Module("perf", "dev.kvshield.perf", List.of("org.bouncycastle", "jcuda")));

    static final Map<String, String> INTERNAL_OWNER = Map.of(
            "dev.kvshield.internal", "allocator-api",
            "dev.kvshield.keys.internal", "tenant-keys",
            "dev.kvshield.cuda.internal", "cuda-scrub",
            "dev.kvshield.bridge.internal", "sglang-bridge",
            "dev.kvshield.perf.internal", "perf");

    private static final Pattern IMPORT = Pattern.compile("^import\\s+(?:static\\s+)?([\\w.]+)", Pattern.MULTILINE);

    @Test
    void importsRespectModuleBoundaries() throws IOException {
        Path repo = Path.of("").toAbsolutePath().getParent();
        List<String> violations = new ArrayList<>();
        int files = 0;
        for (Module m : MODULES) {
            Path src = repo.resolve(m.dir()).resolve("src/main/java");
            if (!Files.isDirectory(src)) {
                continue;
            }
            try (Stream<Path> paths = Files.walk(src)) {
                for (Path f : paths.filter(p -> p.toString().endsWith(".java")).toList()) {
                    files++;
                    Matcher im = IMPORT.matcher(read(f));
                    while (im.find()) {
                        String imported = im.group(1);
                        for (String bad : m.forbidden()) {
                            if (imported.startsWith(bad)) {
                                violations.add(repo.relativize(f) + " imports " + imported);
                            }
                        }
                        INTERNAL_OWNER.forEach((pkg, owner) -> {
                            if (imported.startsWith(pkg + ".") && !owner.equals(m.dir())) {
                                violations.add(repo.relativize(f) + " imports " + owner + "'s internal " + imported);
                            }
                        });
                    }
                }
            }
        }
        assertTrue(files > 20, "found only " + files + " source files under " + repo);
        assertTrue(violations.isEmpty(), String.join("\n", violations));
    }

    private static String read(Path f) {
        try {
            return Files.readString(f);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
