package dev.kvshield.keys;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * {@link RootKeySource#inheritedFd}: reads the descriptor through {@code /proc/self/fd/<fd>}
 * (Linux), which opens what the descriptor refers to without native code. A pipe yields its
 * bytes once, so a parent that writes the key into a pipe leaves nothing behind.
 */
final class InheritedFdRootKeySource implements RootKeySource {
    private final int fd;

    InheritedFdRootKeySource(int fd) {
        if (fd < 0) {
            throw new IllegalArgumentException("file descriptor must be >= 0: " + fd);
        }
        this.fd = fd;
    }

    @Override
    public RootKey load() {
        Path path = Path.of("/proc/self/fd", Integer.toString(fd));
        return RootKey.fill(key -> {
            try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
                RootKey.readExactly(channel, key, "inherited file descriptor " + fd);
            } catch (IOException e) {
                throw new KeySourceException("cannot read a root key from inherited file descriptor " + fd + " (" + path + "): "
                        + e.getMessage(), e);
            }
        });
    }

    @Override
    public String describe() {
        return "inherited file descriptor " + fd;
    }
}
