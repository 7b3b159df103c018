package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class RootKeySourceTest {
    @TempDir
    Path dir;

    @Test
    void ownerOnlyKeyFileLoadsAndItsIdIsStable() {
        Path file = TestKeys.keyFile(dir, "root.key", TestKeys.sequential(32, 0), "rw-------");
        RootKeySource source = RootKeySource.keyFile(file);
        try (RootKey a = source.load(); RootKey b = source.load()) {
            assertEquals(a.keyId(), b.keyId());
            assertTrue(a.keyId().matches("root-[0-9a-f]{16}"), a.keyId());
        }
        Path other = TestKeys.keyFile(dir, "other.key", TestKeys.sequential(32, 1), "r--------");
        try (RootKey a = source.load(); RootKey b = RootKeySource.keyFile(other).load()) {
            assertNotEquals(a.keyId(), b.keyId());
        }
    }

    @Test
    void refusesAKeyFileOthersCanReadAndSaysSo() {
        for (String permissions : List.of("rw-r--r--", "rw-r-----", "rw----r--", "rw--w----", "rw-----w-")) {
            Path file = TestKeys.keyFile(dir, "k" + permissions.hashCode() + ".key", TestKeys.sequential(32, 0), permissions);
            KeySourceException e = assertThrows(KeySourceException.class, () -> RootKeySource.keyFile(file).load(), permissions);
            assertTrue(e.getMessage().contains(file.toString()) && e.getMessage().contains(permissions)
                    && e.getMessage().contains("other than its owner") && e.getMessage().contains("refusing to start"), e.getMessage());
        }
    }

    @Test
    void refusesKeyFilesOfTheWrongSizeMissingFilesAndDirectories() {
        Path shortFile = TestKeys.keyFile(dir, "short.key", new byte[31], "rw-------");
        KeySourceException e = assertThrows(KeySourceException.class, () -> RootKeySource.keyFile(shortFile).load());
        assertTrue(e.getMessage().contains("holds 31 bytes"), e.getMessage());
        Path longFile = TestKeys.keyFile(dir, "long.key", new byte[33], "rw-------");
        e = assertThrows(KeySourceException.class, () -> RootKeySource.keyFile(longFile).load());
        assertTrue(e.getMessage().contains("more than 32 bytes"), e.getMessage());
        assertThrows(KeySourceException.class, () -> RootKeySource.keyFile(dir.resolve("missing.key")).load());
        e = assertThrows(KeySourceException.class, () -> RootKeySource.keyFile(dir).load());
        assertTrue(e.getMessage().contains("not a regular file"), e.getMessage());
    }

    @Test
    void inheritedDescriptorYieldsTheSameKeyAsItsFile() throws IOException {
        Path file = TestKeys.keyFile(dir, "fd.key", TestKeys.sequential(32, 9), "rw-------");
        try (FileChannel open = FileChannel.open(file, StandardOpenOption.READ)) {
            int fd = descriptorOf(file);
            RootKeySource source = RootKeySource.inheritedFd(fd);
            assertEquals("inherited file descriptor " + fd, source.describe());
            try (RootKey viaFd = source.load(); RootKey viaFile = RootKeySource.keyFile(file).load()) {
                assertEquals(viaFile.keyId(), viaFd.keyId());
            }
        }
        assertThrows(IllegalArgumentException.class, () -> RootKeySource.inheritedFd(-1));
        KeySourceException e = assertThrows(KeySourceException.class, () -> RootKeySource.inheritedFd(999_999).load());
        assertTrue(e.getMessage().contains("999999"), e.getMessage());
    }

    @Test
    void ephemeralKeyIsOneKeyPerSourceLoggedOnceAsDevelopmentOnly() {
        try (TestKeys.LogCapture logs = new TestKeys.LogCapture(); RootKeySource source = RootKeySource.ephemeral()) {
            String id;
            try (RootKey a = source.load(); RootKey b = source.load()) {
                assertEquals(a.keyId(), b.keyId());
                id = a.keyId();
            }
            List<String> warnings = logs.messages().stream().filter(m -> m.contains("ephemeral")).toList();
            assertEquals(1, warnings.size(), warnings.toString());
            assertTrue(warnings.get(0).startsWith("WARNING") && warnings.get(0).contains(id)
                    && warnings.get(0).contains("development"), warnings.get(0));
            try (RootKeySource other = RootKeySource.ephemeral(); RootKey c = other.load()) {
                assertNotEquals(id, c.keyId());
            }
        }
    }

    @Test
    void closedRootKeyRefusesUse() {
        Path file = TestKeys.keyFile(dir, "closed.key", TestKeys.sequential(32, 3), "rw-------");
        RootKey key = RootKeySource.keyFile(file).load();
        key.close();
        key.close();
        assertThrows(KeyUnavailableException.class, key::segment);
    }

    /** The number of a descriptor this process holds open on {@code file}. */
    private static int descriptorOf(Path file) throws IOException {
        Path real = file.toRealPath();
        try (Stream<Path> fds = Files.list(Path.of("/proc/self/fd"))) {
            for (Path fd : fds.toList()) {
                try {
                    if (Files.readSymbolicLink(fd).equals(real)) {
                        return Integer.parseInt(fd.getFileName().toString());
                    }
                } catch (IOException ignored) {
                    // Descriptors closed while listing.
                }
            }
        }
        throw new IllegalStateException("no open descriptor on " + real);
    }
}
