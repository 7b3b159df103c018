package dev.kvshield.keys;

import dev.kvshield.keys.internal.Hkdf;
import dev.kvshield.tenant.TenantRegistry;
import java.io.ByteArrayOutputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.Arrays;
import java.util.concurrent.locks.StampedLock;

/**
 * The per-tenant data keys of one pool (one tensor-parallel rank of one pool, in one process):
 * 32-byte ChaCha20 keys derived from a root key, one per (tenant, epoch), held off-heap.
 *
 * <p>Derivation: {@code key = HKDF-SHA256(IKM = root key, salt = SALT_LABEL, info)} with
 * {@code info} the concatenation of length-prefixed fields (each a big-endian u32 byte length,
 * then the bytes):
 *
 * <pre>
 *   VERSION_LABEL ("kvshield/page-key/v1", UTF-8)
 *   tenant name   (UTF-8, TenantRegistry.name(tenant))
 *   epoch         (u32, big-endian)
 *   pool id       (UTF-8)
 *   rank          (u32, big-endian)
 *   boot nonce    (16 random bytes drawn when this keyring is opened)
 * </pre>
 *
 * so two pools, two ranks, two processes or two boots never share a key, even though their page
 * ids and generations coincide.
 *
 * <p>Epochs: a tenant's first key is epoch 0, created on first use; {@link #rotate} makes a new
 * epoch current for new seals while older epochs stay available until {@link #retireEpoch}; an
 * unavailable epoch's key is zeroed. {@link #shred} destroys every epoch of a tenant for good.
 *
 * <p>Key hygiene: key bytes live off-heap and are zeroed when retired, shredded or closed; logs
 * and exceptions name tenants, epochs and {@link #keyId key ids} only. The one way out is
 * {@link #copyKeyForKernelLaunchDangerously}, for a GPU launch.
 *
 * <p>Thread-safe. Implementation notes: one {@link StampedLock}; key use (the CPU sealer's XOR,
 * copies for kernel launches) holds its read lock, so a shred or retirement (write lock) waits for
 * in-flight uses and never zeroes a key half-way through a seal.
 */
public final class TenantKeyring implements AutoCloseable {
    /** The version label bound first into every data key's derivation. */
    public static final String VERSION_LABEL = "kvshield/page-key/v1";
    /** The HKDF salt: a fixed label. */
    public static final String SALT_LABEL = "kvshield/page-key-salt/v1";
    /** Bytes of the per-keyring random value bound into every derivation. */
    public static final int BOOT_NONCE_BYTES = 16;
    /** Bytes of a data key. */
    public static final int KEY_BYTES = 32;

    private static final System.Logger LOG = System.getLogger(TenantKeyring.class.getName());
    private static final byte[] SALT = SALT_LABEL.getBytes(StandardCharsets.UTF_8);
    private static final SecureRandom BOOT_RANDOM = new SecureRandom();

    /** Work done with a key while the keyring guarantees it stays intact; see {@link #withKey}. */
    interface PageKeyUse {
        void apply(MemorySegment key, int[] pages, int[] generations, int offset, int count);
    }

    private final RootKey root;
    private final String poolId;
    private final int rank;
    private final TenantRegistry tenants;
    private final byte[] bootNonce = new byte[BOOT_NONCE_BYTES];
    private final Arena arena = Arena.ofShared();
    private final StampedLock lock = new StampedLock();
    private TenantKeys[] byTenant = new TenantKeys[0]; // guarded by lock
    private boolean closed; // guarded by lock

    private static final class TenantKeys {
        MemorySegment[] keysByEpoch = new MemorySegment[2]; // null: never created, or destroyed
        int epochs;
        int current = -1;
        boolean shredded;
    }

    private TenantKeyring(RootKey root, String poolId, int rank, TenantRegistry tenants) {
        this.root = root;
        this.poolId = poolId;
        this.rank = rank;
        this.tenants = tenants;
        BOOT_RANDOM.nextBytes(bootNonce);
    }

    /**
     * Opens the keyring of pool {@code poolId}, rank {@code rank}: loads the root key from
     * {@code source} (the keyring owns and closes it) and draws a fresh boot nonce.
     *
     * @throws KeySourceException if the root key cannot be loaded safely
     */
    public static TenantKeyring open(RootKeySource source, String poolId, int rank, TenantRegistry tenants) {
        if (poolId == null || poolId.isEmpty() || rank < 0 || tenants == null) {
            throw new IllegalArgumentException("a keyring needs a pool id, a rank >= 0 and a tenant registry: poolId='" + poolId
                    + "' rank=" + rank);
        }
        RootKey root = source.load();
        TenantKeyring keyring = new TenantKeyring(root, poolId, rank, tenants);
        LOG.log(System.Logger.Level.INFO, "pool " + poolId + " rank " + rank + ": tenant keyring opened with root key "
                + root.keyId() + " from " + source.describe());
        return keyring;
    }

    /** The root key's fingerprint. */
    public String rootKeyId() {
        return root.keyId();
    }

    /** A copy of the boot nonce bound into this keyring's derivations (random, not secret). */
    public byte[] bootNonce() {
        return bootNonce.clone();
    }

    public String poolId() {
        return poolId;
    }

    public int rank() {
        return rank;
    }

    /** A loggable id of a tenant key epoch: root key id, pool, rank, tenant and epoch (no key bytes). */
    public String keyId(int tenant, int epoch) {
        return root.keyId() + "/" + poolId + "/rank" + rank + "/" + tenants.name(tenant) + "/e" + epoch;
    }

    /** True if {@code tenant} is registered and not shredded, so it can seal. */
    public boolean canSeal(int tenant) {
        long stamp = lock.readLock();
        try {
            if (closed || !tenants.isRegistered(tenant)) {
                return false;
            }
            TenantKeys keys = tenant < byTenant.length ? byTenant[tenant] : null;
            return keys == null || !keys.shredded;
        } finally {
            lock.unlockRead(stamp);
        }
    }

    /**
     * The epoch new seals of {@code tenant} use, creating epoch 0 on first use.
     *
     * @throws KeyUnavailableException if the tenant was shredded or the keyring is closed
     */
    public int currentEpoch(int tenant) {
        long stamp = lock.readLock();
        try {
            checkOpen();
            TenantKeys keys = tenant >= 0 && tenant < byTenant.length ? byTenant[tenant] : null;
            if (keys != null && keys.current >= 0 && !keys.shredded) {
                return keys.current;
            }
        } finally {
            lock.unlockRead(stamp);
        }
        stamp = lock.writeLock();
        try {
            checkOpen();
            TenantKeys keys = keysOf(tenant);
            if (keys.current < 0 && !keys.shredded) {
                createEpoch(tenant, keys);
            }
            checkNotShredded(tenant, keys);
            return keys.current;
        } finally {
            lock.unlockWrite(stamp);
        }
    }

    /**
     * Makes a new epoch current for {@code tenant}'s new seals; pages sealed under older epochs stay
     * reclaimable until those epochs are retired.
     *
     * @return the new epoch
     * @throws KeyUnavailableException if the tenant was shredded
     */
    public int rotate(int tenant) {
        long stamp = lock.writeLock();
        try {
            checkOpen();
            TenantKeys keys = keysOf(tenant);
            checkNotShredded(tenant, keys);
            if (keys.current < 0) {
                createEpoch(tenant, keys);
            }
            return createEpoch(tenant, keys);
        } finally {
            lock.unlockWrite(stamp);
        }
    }

    /**
     * Retires an older epoch of {@code tenant}: its key is zeroed and pages sealed under it become
     * unrecoverable. Retiring an already retired epoch does nothing.
     *
     * @throws IllegalArgumentException for the current epoch (rotate first) or an epoch never created
     */
    public void retireEpoch(int tenant, int epoch) {
        long stamp = lock.writeLock();
        try {
            checkOpen();
            TenantKeys keys = keysOf(tenant);
            if (epoch < 0 || epoch >= keys.epochs) {
                throw new IllegalArgumentException("tenant " + tenant + " has no key epoch " + epoch + " (epochs 0.."
                        + (keys.epochs - 1) + ")");
            }
            if (epoch == keys.current && !keys.shredded) {
                throw new IllegalArgumentException("epoch " + epoch + " is tenant " + tenant + "'s current epoch; rotate before"
                        + " retiring it");
            }
            if (destroy(keys, epoch)) {
                LOG.log(System.Logger.Level.INFO, "retired key " + keyId(tenant, epoch));
            }
        } finally {
            lock.unlockWrite(stamp);
        }
    }

    /** True while pages {@code tenant} sealed under {@code epoch} can be unsealed. */
    public boolean isEpochAvailable(int tenant, int epoch) {
        long stamp = lock.readLock();
        try {
            return keyOrNull(tenant, epoch) != null;
        } finally {
            lock.unlockRead(stamp);
        }
    }

    /**
     * Crypto-shreds {@code tenant}: zeroes every key epoch it has and refuses to create more, so
     * nothing it sealed can be unsealed again and it can no longer seal.
     *
     * @return how many key epochs were destroyed
     */
    public int shred(int tenant) {
        long stamp = lock.writeLock();
        try {
            checkOpen();
            TenantKeys keys = keysOf(tenant);
            int destroyed = 0;
            for (int e = 0; e < keys.epochs; e++) {
                if (destroy(keys, e)) {
                    destroyed++;
                }
            }
            keys.shredded = true;
            LOG.log(System.Logger.Level.WARNING, "pool " + poolId + " rank " + rank + ": crypto-shredded tenant '"
                    + tenants.name(tenant) + "' (id " + tenant + "): destroyed " + destroyed + " of " + keys.epochs
                    + " key epochs under root key " + root.keyId());
            return destroyed;
        } finally {
            lock.unlockWrite(stamp);
        }
    }

    /** True once {@link #shred} ran for {@code tenant}. */
    public boolean isShredded(int tenant) {
        long stamp = lock.readLock();
        try {
            return tenant >= 0 && tenant < byTenant.length && byTenant[tenant] != null && byTenant[tenant].shredded;
        } finally {
            lock.unlockRead(stamp);
        }
    }

    /**
     * Copies the 32 raw bytes of (tenant, epoch)'s data key into {@code dst[0, 32)} for a GPU kernel
     * launch. Dangerous: the copy is outside this keyring's control. The caller wipes
     * {@code dst} after the launch (as soon as the kernel has read its arguments) and never logs,
     * stores or returns it.
     *
     * @throws KeyUnavailableException if the epoch is retired, shredded or was never created
     */
    public void copyKeyForKernelLaunchDangerously(int tenant, int epoch, MemorySegment dst) {
        if (dst.byteSize() < KEY_BYTES) {
            throw new IllegalArgumentException("destination holds " + dst.byteSize() + " bytes; a key is " + KEY_BYTES);
        }
        long stamp = lock.readLock();
        try {
            MemorySegment.copy(requireKey(tenant, epoch), 0, dst, 0, KEY_BYTES);
        } finally {
            lock.unlockRead(stamp);
        }
    }

    /**
     * Runs {@code use} with (tenant, epoch)'s key while no shred, retirement or close can zero it.
     * {@code use} must not keep the key segment or call back into this keyring.
     */
    void withKey(int tenant, int epoch, PageKeyUse use, int[] pages, int[] generations, int offset, int count) {
        long stamp = lock.readLock();
        try {
            use.apply(requireKey(tenant, epoch), pages, generations, offset, count);
        } finally {
            lock.unlockRead(stamp);
        }
    }

    /** Zeroes every key and the root key; later calls fail with {@link KeyUnavailableException}. */
    @Override
    public void close() {
        long stamp = lock.writeLock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            for (TenantKeys keys : byTenant) {
                if (keys != null) {
                    for (int e = 0; e < keys.epochs; e++) {
                        destroy(keys, e);
                    }
                }
            }
            arena.close();
            root.close();
        } finally {
            lock.unlockWrite(stamp);
        }
    }

    // Called with the read or write lock held.
    private MemorySegment requireKey(int tenant, int epoch) {
        MemorySegment key = keyOrNull(tenant, epoch);
        if (key == null) {
            checkOpen();
            tenants.check(tenant);
            throw new KeyUnavailableException("key epoch " + epoch + " of tenant " + tenant + " ('" + tenants.name(tenant)
                    + "') of pool " + poolId + " rank " + rank + " is not available (retired, shredded or never created)");
        }
        return key;
    }

    private MemorySegment keyOrNull(int tenant, int epoch) {
        if (closed || tenant < 0 || tenant >= byTenant.length || byTenant[tenant] == null) {
            return null;
        }
        TenantKeys keys = byTenant[tenant];
        return keys.shredded || epoch < 0 || epoch >= keys.epochs ? null : keys.keysByEpoch[epoch];
    }

    private void checkOpen() {
        if (closed) {
            throw new KeyUnavailableException("the keyring of pool " + poolId + " rank " + rank + " is closed");
        }
    }

    private void checkNotShredded(int tenant, TenantKeys keys) {
        if (keys.shredded) {
            throw new KeyUnavailableException("tenant " + tenant + " ('" + tenants.name(tenant) + "') was crypto-shredded in pool "
                    + poolId + " rank " + rank + "; it has no keys");
        }
    }

    // Write lock held.
    private TenantKeys keysOf(int tenant) {
        tenants.check(tenant);
        if (tenant >= byTenant.length) {
            byTenant = Arrays.copyOf(byTenant, Math.max(tenant + 1, byTenant.length * 2));
        }
        TenantKeys keys = byTenant[tenant];
        if (keys == null) {
            keys = new TenantKeys();
            byTenant[tenant] = keys;
        }
        return keys;
    }

    // Write lock held.
    private int createEpoch(int tenant, TenantKeys keys) {
        int epoch = keys.epochs;
        if (epoch == Integer.MAX_VALUE) {
            throw new KeyUnavailableException("tenant " + tenant + " has used every key epoch");
        }
        MemorySegment key = arena.allocate(KEY_BYTES, 32);
        Hkdf.deriveSha256(root.segment(), SALT, info(tenants.name(tenant), epoch), key);
        if (epoch == keys.keysByEpoch.length) {
            keys.keysByEpoch = Arrays.copyOf(keys.keysByEpoch, epoch * 2);
        }
        keys.keysByEpoch[epoch] = key;
        keys.epochs = epoch + 1;
        keys.current = epoch;
        LOG.log(System.Logger.Level.INFO, "key " + keyId(tenant, epoch) + " is current for new seals");
        return epoch;
    }

    private static boolean destroy(TenantKeys keys, int epoch) {
        MemorySegment key = keys.keysByEpoch[epoch];
        if (key == null) {
            return false;
        }
        key.fill((byte) 0);
        keys.keysByEpoch[epoch] = null;
        return true;
    }

    private byte[] info(String tenantName, int epoch) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        field(out, VERSION_LABEL.getBytes(StandardCharsets.UTF_8));
        field(out, tenantName.getBytes(StandardCharsets.UTF_8));
        field(out, ByteBuffer.allocate(4).putInt(epoch).array());
        field(out, poolId.getBytes(StandardCharsets.UTF_8));
        field(out, ByteBuffer.allocate(4).putInt(rank).array());
        field(out, bootNonce);
        return out.toByteArray();
    }

    private static void field(ByteArrayOutputStream out, byte[] bytes) {
        out.writeBytes(ByteBuffer.allocate(4).putInt(bytes.length).array());
        out.writeBytes(bytes);
    }
}
