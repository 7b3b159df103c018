package dev.kvshield.keys.cipher;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * {@link ChaCha20}'s choice of path in JVMs started without this project's flags (test JVMs pass
 * both, so only a child JVM sees the fallbacks): the path {@code implementation()} names, no class
 * loading failure, and the same bytes as Bouncy Castle.
 */
class ChaCha20FallbackTest {
    private static final String OPENS = "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED";
    private static final String VECTOR_MODULE = "--add-modules=jdk.incubator.vector";

    @Test
    void withoutTheOpensFlagTheVectorPathRunsWithTheSameBytes() throws Exception {
        // The same CPU as this JVM: the wide path its vector width allows.
        String expected = GatheredChaCha20.FITS ? "vector-16" : VectorChaCha20.FITS ? "vector-8" : "scalar";
        assertChildRuns(expected, VECTOR_MODULE);
    }

    @Test
    void withoutTheVectorModuleTheScalarPathRunsWithTheSameBytes() throws Exception {
        // JdkChaCha20 and the wide paths use the Vector API: none of them may be loaded here.
        assertChildRuns("scalar", OPENS);
    }

    private static void assertChildRuns(String expectedImplementation, String flag) throws IOException, InterruptedException {
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        List<String> command = List.of(java, flag, "-cp", System.getProperty("java.class.path"), ChaCha20PathProbe.class.getName());
        Process child = new ProcessBuilder(command).redirectErrorStream(true).start();
        String output = new String(child.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(child.waitFor(30, TimeUnit.SECONDS), "child JVM did not finish: " + command);
        assertEquals(0, child.exitValue(), output);
        String[] lines = output.lines().filter(l -> !l.startsWith("WARNING")).toArray(String[]::new);
        assertEquals(2, lines.length, output);
        assertEquals(expectedImplementation, lines[0], "path taken with only " + flag);
        byte[] key = new byte[ChaCha20.KEY_BYTES];
        for (int i = 0; i < key.length; i++) {
            key[i] = (byte) i;
        }
        byte[] keystream = BouncyChaCha.keystream(key, 1, 2, 3, ChaCha20PathProbe.COUNTER, ChaCha20PathProbe.LENGTH);
        byte[] guard = new byte[ChaCha20PathProbe.OFFSET];
        HexFormat hex = HexFormat.of();
        assertEquals(hex.formatHex(guard) + hex.formatHex(keystream) + hex.formatHex(guard), lines[1], "bytes with only " + flag);
    }
}
