package dev.kvshield.audit;

import dev.kvshield.audit.internal.RecordChain;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.Signature;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Base64;
import java.util.EnumSet;
import java.util.HexFormat;
import java.util.Set;

/**
 * The operator's Ed25519 checkpoint-signing key: generation, loading, and the public-key
 * fingerprint that checkpoints name. Files are PEM: the private key file ({@value #PRIVATE_FILE},
 * owner-only permissions) holds the PKCS#8 private key and, for convenience, the public key; the
 * public key file ({@value #PUBLIC_FILE}) holds the X.509 public key the operator pins on verifiers.
 */
public final class AuditKeys {
    public static final String PRIVATE_FILE = "audit-signing.key";
    public static final String PUBLIC_FILE = "audit-signing.pub";
    private static final String ALGORITHM = "Ed25519";
    private static final Set<PosixFilePermission> OWNER_ONLY = EnumSet.of(PosixFilePermission.OWNER_READ,
            PosixFilePermission.OWNER_WRITE);

    private AuditKeys() {}

    /** A loaded signing key. No {@code toString}, {@code equals} or {@code hashCode} beyond identity. */
    public static final class SigningKey {
        private final PrivateKey privateKey;
        private final PublicKey publicKey;

        private SigningKey(PrivateKey privateKey, PublicKey publicKey) {
            this.privateKey = privateKey;
            this.publicKey = publicKey;
        }

        /** The fingerprint of the public half, as checkpoints record it. */
        public String fingerprint() {
            return AuditKeys.fingerprint(publicKey);
        }

        public PublicKey publicKey() {
            return publicKey;
        }

        /** Signs {@code message}; thread-safe. */
        public byte[] sign(byte[] message) {
            try {
                Signature s = Signature.getInstance(ALGORITHM);
                s.initSign(privateKey);
                s.update(message);
                return s.sign();
            } catch (GeneralSecurityException e) {
                throw new IllegalStateException("Ed25519 signing failed: " + e.getClass().getSimpleName(), e);
            }
        }
    }

    /** A fresh in-memory key (tests, benchmarks). */
    public static SigningKey generateInMemory() {
        KeyPair pair = newPair();
        return new SigningKey(pair.getPrivate(), pair.getPublic());
    }

    /**
     * Writes a new key pair into {@code dir}: {@value #PRIVATE_FILE} (mode 600) and
     * {@value #PUBLIC_FILE}. Refuses to overwrite either.
     *
     * @return the public key's fingerprint
     */
    public static String generate(Path dir) throws IOException {
        Files.createDirectories(dir);
        Path priv = dir.resolve(PRIVATE_FILE);
        Path pub = dir.resolve(PUBLIC_FILE);
        for (Path p : new Path[] {priv, pub}) {
            if (Files.exists(p)) {
                throw new FileAlreadyExistsException(p + " exists; refusing to overwrite an audit key");
            }
        }
        KeyPair pair = newPair();
        String pubPem = pem("PUBLIC KEY", pair.getPublic().getEncoded());
        Files.createFile(priv, PosixFilePermissions.asFileAttribute(OWNER_ONLY));
        Files.writeString(priv, pem("PRIVATE KEY", pair.getPrivate().getEncoded()) + pubPem, StandardCharsets.US_ASCII);
        Files.writeString(pub, pubPem, StandardCharsets.US_ASCII);
        return fingerprint(pair.getPublic());
    }

    /**
     * Loads a private key file written by {@link #generate}.
     *
     * @throws IOException if the file is readable by anyone but its owner, or is not such a file
     */
    public static SigningKey loadSigningKey(Path file) throws IOException {
        Set<PosixFilePermission> perms = Files.getPosixFilePermissions(file);
        if (!OWNER_ONLY.containsAll(perms)) {
            throw new IOException("audit signing key " + file + " has permissions " + PosixFilePermissions.toString(perms)
                    + "; it must be readable by its owner only (chmod 600)");
        }
        String text = Files.readString(file, StandardCharsets.US_ASCII);
        try {
            KeyFactory kf = KeyFactory.getInstance(ALGORITHM);
            PrivateKey priv = kf.generatePrivate(new PKCS8EncodedKeySpec(unpem(text, "PRIVATE KEY", file)));
            PublicKey pub = kf.generatePublic(new X509EncodedKeySpec(unpem(text, "PUBLIC KEY", file)));
            SigningKey key = new SigningKey(priv, pub);
            byte[] probe = "kvshield-audit-key-probe".getBytes(StandardCharsets.US_ASCII);
            if (!verify(pub, probe, key.sign(probe))) {
                throw new IOException("audit signing key " + file + ": its private and public halves do not match");
            }
            return key;
        } catch (GeneralSecurityException | IllegalArgumentException e) {
            throw new IOException("audit signing key " + file + " is not an Ed25519 key written by 'audit keygen': "
                    + e.getClass().getSimpleName());
        }
    }

    /** Loads a public key file ({@value #PUBLIC_FILE}, or the private file, whose public block is used). */
    public static PublicKey loadPublicKey(Path file) throws IOException {
        try {
            return KeyFactory.getInstance(ALGORITHM).generatePublic(new X509EncodedKeySpec(
                    unpem(Files.readString(file, StandardCharsets.US_ASCII), "PUBLIC KEY", file)));
        } catch (GeneralSecurityException | IllegalArgumentException e) {
            throw new IOException("public key " + file + " is not an Ed25519 public key: " + e.getClass().getSimpleName());
        }
    }

    /** The first 16 bytes of the SHA-256 of the public key's X.509 encoding, in hex. */
    public static String fingerprint(PublicKey key) {
        return HexFormat.of().formatHex(RecordChain.sha256().digest(key.getEncoded()), 0, 16);
    }

    /** Checks an Ed25519 signature; false for any malformed input. */
    public static boolean verify(PublicKey key, byte[] message, byte[] signature) {
        try {
            Signature s = Signature.getInstance(ALGORITHM);
            s.initVerify(key);
            s.update(message);
            return s.verify(signature);
        } catch (GeneralSecurityException e) {
            return false;
        }
    }

    private static KeyPair newPair() {
        try {
            return KeyPairGenerator.getInstance(ALGORITHM).generateKeyPair();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("the JDK has no Ed25519", e);
        }
    }

    private static String pem(String label, byte[] der) {
        return "-----BEGIN " + label + "-----\n" + Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(der)
                + "\n-----END " + label + "-----\n";
    }

    private static byte[] unpem(String text, String label, Path file) throws IOException {
        String begin = "-----BEGIN " + label + "-----";
        int a = text.indexOf(begin);
        int b = text.indexOf("-----END " + label + "-----");
        if (a < 0 || b < a) {
            throw new IOException(file + " holds no " + label + " block");
        }
        return Base64.getMimeDecoder().decode(text.substring(a + begin.length(), b));
    }
}
