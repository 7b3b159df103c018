package dev.kvshield.testing;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.ProtectionException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.function.IntBinaryOperator;

/**
 * A stand-in sealer with key epochs and faults, for pool tests (not a cipher): XORs a keystream
 * seeded by (tenant, epoch, page, generation, buffer). Each tenant seals under its current epoch
 * ({@link #rotate} starts the next); a retired or shredded epoch cannot unseal. Faults: seal or
 * unseal fails after {@code k} pages counted across calls from the arming; a hook runs before each
 * unseal call (to retire an epoch between the two calls of one reclaim). The planted-bug variant
 * {@link #swallowing} stops unsealing after {@code k} pages but returns normally.
 */
public class EpochSealer implements PageSealer {
    private final PageMemory memory;
    private final boolean swallow;
    private final Map<Integer, Integer> epochs = new HashMap<>();
    private final Set<Long> retired = new HashSet<>();
    private final Set<Integer> shredded = new HashSet<>();
    private final Set<Long> sealedOnce = new HashSet<>();
    private int sealBudget = -1;
    private int unsealBudget = -1;
    private IntBinaryOperator beforeUnseal = (tenant, epoch) -> 0;

    public EpochSealer(PageMemory memory) {
        this(memory, false);
    }

    private EpochSealer(PageMemory memory, boolean swallow) {
        this.memory = memory;
        this.swallow = swallow;
    }

    /** Planted bug: an unseal that stops after its budget and reports success. */
    public static EpochSealer swallowing(PageMemory memory) {
        return new EpochSealer(memory, true);
    }

    public synchronized int epoch(int tenant) {
        return epochs.getOrDefault(tenant, 1);
    }

    /** Later seals of {@code tenant} use a new epoch; returns it. */
    public synchronized int rotate(int tenant) {
        int e = epoch(tenant) + 1;
        epochs.put(tenant, e);
        return e;
    }

    /** Pages sealed under {@code epoch} can no longer be unsealed. */
    public synchronized void retire(int tenant, int epoch) {
        retired.add(((long) tenant << 32) | epoch);
    }

    /** Seals fail after {@code pages} more pages; -1 disarms. */
    public synchronized void failSealAfter(int pages) {
        sealBudget = pages;
    }

    /** Unseals fail after {@code pages} more pages; -1 disarms. */
    public synchronized void failUnsealAfter(int pages) {
        unsealBudget = pages;
    }

    /** Runs before every unseal call with (tenant, epoch). */
    public synchronized void beforeUnseal(IntBinaryOperator hook) {
        beforeUnseal = hook;
    }

    @Override
    public synchronized boolean canSeal(int tenant) {
        return !shredded.contains(tenant);
    }

    @Override
    public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
        if (shredded.contains(tenant)) {
            throw new ProtectionException("tenant " + tenant + " is shredded");
        }
        int epoch = epoch(tenant);
        for (int i = offset; i < offset + count; i++) {
            if (sealBudget == 0) {
                throw new ProtectionException("injected seal fault at page " + pages[i]);
            }
            if (!sealedOnce.add(((long) pages[i] << 32) | generations[i])) {
                throw new IllegalStateException("page " + pages[i] + " generation " + generations[i] + " sealed twice");
            }
            sealBudget = sealBudget > 0 ? sealBudget - 1 : sealBudget;
            xor(tenant, epoch, pages[i], generations[i]);
        }
        return epoch;
    }

    @Override
    public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
        IntBinaryOperator hook;
        synchronized (this) {
            hook = beforeUnseal;
        }
        hook.applyAsInt(tenant, epoch);
        synchronized (this) {
            if (!isEpochAvailable(tenant, epoch)) {
                throw new ProtectionException("epoch " + epoch + " of tenant " + tenant + " is retired");
            }
            for (int i = offset; i < offset + count; i++) {
                if (unsealBudget == 0) {
                    if (swallow) {
                        return;
                    }
                    throw new ProtectionException("injected unseal fault at page " + pages[i]);
                }
                unsealBudget = unsealBudget > 0 ? unsealBudget - 1 : unsealBudget;
                xor(tenant, epoch, pages[i], generations[i]);
            }
        }
    }

    private void xor(int tenant, int epoch, int page, int generation) {
        for (int b = 0; b < memory.geometry().bufferCount(); b++) {
            MemorySegment region = memory.hostRegion(page, b);
            SplittableRandom stream = new SplittableRandom(tenant * 1_000_003L + epoch * 104_729L + page * 7919L + generation * 31L + b);
            for (long o = 0; o < region.byteSize(); o++) {
                region.set(ValueLayout.JAVA_BYTE, o, (byte) (region.get(ValueLayout.JAVA_BYTE, o) ^ stream.nextInt()));
            }
        }
    }

    @Override
    public synchronized boolean isEpochAvailable(int tenant, int epoch) {
        return !shredded.contains(tenant) && !retired.contains(((long) tenant << 32) | epoch);
    }

    @Override
    public synchronized void shred(int tenant) {
        shredded.add(tenant);
    }
}
