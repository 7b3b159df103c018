package dev.kvshield.perf.fuzz;

import dev.kvshield.memory.ForwardingPageMemory;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealer;

/**
 * Protection faults a trace arms ({@code fault K}): the next scrub (of any kind: release
 * protection, clearing sealed pages for a hand-out, the boundary's scrub of failed pages) or seal
 * does its work on the first {@code K mod n} pages of its batch of {@code n} and throws, as a kernel
 * that faulted part way through a launch. One armed fault fires once.
 *
 * <p>Thread-safe: the protection worker and the scheduler thread may both reach it.
 */
final class Faults {
    private int armedAfterPages = -1;
    private int fired;

    /** The exception an armed fault throws; planted twins that swallow faults recognise it. */
    static final class InjectedFault extends RuntimeException {
        InjectedFault(String message) {
            super(message);
        }
    }

    synchronized void arm(int afterPages) {
        armedAfterPages = afterPages;
    }

    synchronized int fired() {
        return fired;
    }

    /** Pages of a batch of {@code count} to process before failing, or -1 when nothing is armed; disarms. */
    private synchronized int take(int count) {
        if (armedAfterPages < 0 || count == 0) {
            return -1;
        }
        int k = armedAfterPages % count;
        armedAfterPages = -1;
        fired++;
        return k;
    }

    private static InjectedFault fault(String what, int done, int count) {
        return new InjectedFault("injected backend fault: " + what + " stopped after " + done + " of " + count + " pages");
    }

    /** The backend under the pool, with the armed fault in its scrubs. */
    PageMemory memory(PageMemory delegate) {
        return new ForwardingPageMemory(delegate) {
            @Override
            public void scrub(int[] pages, int offset, int count) {
                int k = take(count);
                if (k < 0) {
                    delegate.scrub(pages, offset, count);
                    return;
                }
                delegate.scrub(pages, offset, k);
                throw fault("scrub", k, count);
            }

            @Override
            public String describe() {
                return "fault-injecting(" + delegate.describe() + ")";
            }
        };
    }

    /** Seals the first pages of a batch, then throws, when armed. */
    int seal(PageSealer sealer, int tenant, int[] pages, int[] generations, int offset, int count) {
        int k = take(count);
        if (k < 0) {
            return sealer.seal(tenant, pages, generations, offset, count);
        }
        if (k > 0) {
            sealer.seal(tenant, pages, generations, offset, k);
        }
        throw fault("seal", k, count);
    }
}
