package dev.kvshield.perf;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The launcher's JDK search: a clear failure naming what it looked at, and success with a JDK 25+. */
class LauncherTest {
    static final Path LAUNCHER = Path.of("").toAbsolutePath().getParent().resolve("kvshield");

    record Result(int exitCode, String output) {}

    static Result run(Path jvmDir, String javaHome, String... args) throws IOException, InterruptedException {
        List<String> command = new java.util.ArrayList<>(List.of("bash", LAUNCHER.toString()));
        command.addAll(List.of(args));
        ProcessBuilder pb = new ProcessBuilder(command).redirectErrorStream(true);
        pb.environment().put("KVSHIELD_JVM_DIR", jvmDir.toString());
        if (javaHome == null) {
            pb.environment().remove("JAVA_HOME");
        } else {
            pb.environment().put("JAVA_HOME", javaHome);
        }
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, TimeUnit.SECONDS));
        return new Result(p.exitValue(), out);
    }

    @Test
    void withoutAJdk25ItFailsNamingWhatItSearched(@TempDir Path empty) throws Exception {
        Path oldJdk = empty.resolve("jdk-17");
        Files.createDirectories(oldJdk.resolve("bin"));
        Path java17 = Path.of("/usr/lib/jvm/java-17-openjdk-amd64");
        String home = Files.isDirectory(java17) ? java17.toString() : "/nonexistent-jdk";
        Result r = run(empty, home, "help");
        assertEquals(1, r.exitCode(), r.output());
        assertTrue(r.output().contains("no JDK 25 or newer found"), r.output());
        assertTrue(r.output().contains("JAVA_HOME=" + home), r.output());
        assertTrue(r.output().contains("install a JDK 25+"), r.output());
    }

    @Test
    void withTheRunningJdkItRunsAndListsItsCommands(@TempDir Path empty) throws Exception {
        Result r = run(empty, System.getProperty("java.home"), "help");
        assertEquals(0, r.exitCode(), r.output());
        assertTrue(r.output().contains("usage: ./kvshield <command>") && r.output().contains("test [--require-deps]"), r.output());
        Result bad = run(empty, System.getProperty("java.home"), "no-such-command");
        assertEquals(1, bad.exitCode());
        assertTrue(bad.output().contains("unknown command 'no-such-command'"), bad.output());
    }
}
