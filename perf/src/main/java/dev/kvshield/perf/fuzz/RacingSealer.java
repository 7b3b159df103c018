package dev.kvshield.perf.fuzz;

import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.ProtectionException;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * The trace's key operator around a real sealer: it rotates a tenant's key epoch after every seal
 * call (so pages released at different times are sealed under different epochs, and a reclaim of
 * them spans epochs), and races a reclaim ({@code race}): right after the tenant's next unseal call,
 * every other epoch of the tenant is retired (unavailable, its unseal throws) or breaks (its next
 * unseal throws once), so a reclaim spanning two epochs fails after its first epoch was decrypted in
 * place. Armed {@link Faults} fail a seal part way through.
 *
 * <p>Implementation notes: epochs are the operator's own ({@code realEpoch * 65536 + rotation}), so
 * rotation needs nothing from the real key source; past 65535 rotations a tenant keeps its last
 * epoch. Thread-safe (the protection worker seals while the scheduler thread reclaims).
 */
final class RacingSealer implements PageSealer {
    private static final int ROTATION_BITS = 16;
    private static final int MAX_ROTATIONS = (1 << ROTATION_BITS) - 1;

    private final PageSealer real;
    private final Faults faults;
    private final Map<Integer, Integer> rotation = new HashMap<>();
    private final Map<Integer, Integer> raceMode = new HashMap<>();
    private final Set<Long> retired = new HashSet<>();
    private final Set<Long> broken = new HashSet<>();
    private final Set<Long> sealedEpochs = new HashSet<>();

    RacingSealer(PageSealer real, Faults faults) {
        this.real = real;
        this.faults = faults;
    }

    private static long key(int tenant, int epoch) {
        return ((long) tenant << 32) | (epoch & 0xFFFF_FFFFL);
    }

    private void rotate(int tenant) {
        rotation.merge(tenant, 1, (a, b) -> Math.min(MAX_ROTATIONS, a + b));
    }

    /** Arms the race on {@code tenant}: 0 retires its other epochs after its next unseal, 1 breaks them. */
    synchronized void race(int tenant, int mode) {
        raceMode.put(tenant, mode);
    }

    @Override
    public boolean canSeal(int tenant) {
        return real.canSeal(tenant);
    }

    @Override
    public int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        int realEpoch = faults.seal(real, tenant, pages, generations, offset, count);
        synchronized (this) {
            int epoch = (realEpoch << ROTATION_BITS) | rotation.getOrDefault(tenant, 0);
            sealedEpochs.add(key(tenant, epoch));
            rotate(tenant);
            return epoch;
        }
    }

    @Override
    public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        synchronized (this) {
            long k = key(tenant, epoch);
            if (retired.contains(k) || broken.remove(k)) {
                throw new ProtectionException("the operator " + (retired.contains(k) ? "retired" : "broke") + " key epoch " + epoch
                        + " of tenant " + tenant + " during the reclaim");
            }
        }
        real.unseal(tenant, epoch >>> ROTATION_BITS, pages, generations, offset, count);
        synchronized (this) {
            Integer mode = raceMode.remove(tenant);
            if (mode != null) {
                for (long k : sealedEpochs) {
                    if ((int) (k >>> 32) == tenant && (int) k != epoch) {
                        (mode == 0 ? retired : broken).add(k);
                    }
                }
            }
        }
    }

    @Override
    public boolean isEpochAvailable(int tenant, int epoch) {
        synchronized (this) {
            if (retired.contains(key(tenant, epoch))) {
                return false;
            }
        }
        return real.isEpochAvailable(tenant, epoch >>> ROTATION_BITS);
    }

    @Override
    public void shred(int tenant) {
        real.shred(tenant);
    }

    @Override
    public void close() {
        real.close();
    }
}
