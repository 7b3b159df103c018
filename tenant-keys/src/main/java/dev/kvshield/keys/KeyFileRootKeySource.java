package dev.kvshield.keys;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;

/** {@link RootKeySource#keyFile}: refuses a file whose permissions let group or others read or write it. */
final class KeyFileRootKeySource implements RootKeySource {
    private static final Set<PosixFilePermission> FORBIDDEN = Set.of(PosixFilePermission.GROUP_READ,
            PosixFilePermission.GROUP_WRITE, PosixFilePermission.OTHERS_READ, PosixFilePermission.OTHERS_WRITE);

    private final Path path;

    KeyFileRootKeySource(Path path) {
        if (path == null) {
            throw new IllegalArgumentException("key file path must not be null");
        }
        this.path = path;
    }

    @Override
    public RootKey load() {
        PosixFileAttributes attributes;
        try {
            attributes = Files.readAttributes(path, PosixFileAttributes.class);
        } catch (UnsupportedOperationException e) {
            throw new KeySourceException("root key file " + path + " is on a file system without POSIX permissions;"
                    + " refusing to start because its readers cannot be checked", e);
        } catch (IOException e) {
            throw new KeySourceException("cannot read the attributes of root key file " + path + ": " + e.getMessage(), e);
        }
        if (!attributes.isRegularFile()) {
            throw new KeySourceException("root key file " + path + " is not a regular file; refusing to start");
        }
        if (attributes.permissions().stream().anyMatch(FORBIDDEN::contains)) {
            throw new KeySourceException("root key file " + path + " has permissions "
                    + PosixFilePermissions.toString(attributes.permissions())
                    + ", which let users other than its owner read or write it; refusing to start (chmod 600 " + path + ")");
        }
        return RootKey.fill(key -> {
            try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
                RootKey.readExactly(channel, key, "root key file " + path);
            } catch (IOException e) {
                throw new KeySourceException("cannot read root key file " + path + ": " + e.getMessage(), e);
            }
        });
    }

    @Override
    public String describe() {
        return "key file " + path;
    }
}
