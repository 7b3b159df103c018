package dev.kvshield.perf.simulate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.perf.testing.SimFixtures;
import dev.kvshield.perf.workload.Trace;
import dev.kvshield.protection.PageSealerFactory;
import dev.kvshield.testing.TestXorSealer;
import org.junit.jupiter.api.Test;

/**
 * Attack round 14: does the report's oracle round see a planted protection bug? Fails today; passes
 * once the oracles can tell a level that protects from one that does not.
 */
class AttackRound14Test {
    private static final SimulationOptions ORACLES = new SimulationOptions(4, 64, 1, true);

    /** Planted bug: an ENCRYPT key source whose seal and unseal leave the page's bytes as they are (plaintext at rest). */
    static final class NoSealSealer extends TestXorSealer {
        NoSealSealer(PageMemory memory) {
            super(memory);
        }

        @Override
        public synchronized int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
            return 1; // says it sealed; the tenant's KV stays in the free page as plaintext
        }

        @Override
        public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {}
    }

    private static SimulationResult run(PageSealerFactory sealer, Trace trace) {
        PoolFactory factory = PoolFactory.synchronous(sealer);
        try (OffHeapPageMemory memory = OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(48));
                OffHeapPageMemory prefillMemory = OffHeapPageMemory.allocate(SimFixtures.tinyGeometry(48));
                ServingPool pool = factory.create(Level.ENCRYPT, memory); ServingPool prefill = factory.create(Level.ENCRYPT, prefillMemory);
                Handoff handoff = Handoff.of(prefill, pool)) {
            return new Simulator(pool, handoff, trace, ORACLES).run();
        }
    }

    /**
     * Promise (README: the report gives per level "what the leak and residue oracles found"; DESIGN:
     * ENCRYPT seals a released page with the tenant's keystream, "it holds only ciphertext", shredding
     * the key "makes everything it left behind noise"; the report's protection figures are the evidence
     * that each level protects at the cost it shows). Plant an ENCRYPT whose seal does nothing: every free
     * sealed page keeps its tenant's KV in plaintext (a memory dump, a late DMA reader or a shredded
     * tenant's pages all expose it). The oracle round reports exactly what it reports for the real seal:
     * 0 leaked bytes and 0 dirty hand-outs, with prefix reclaims served, because the residue oracle checks
     * pages only at hand-out (zeroed there for other tenants, and a reclaim may hold the tenant's own
     * canary) and nothing reads a sealed page at rest. So the report's encrypt row would certify an
     * ENCRYPT that never encrypts, and show its cost as cheaper. Severity: medium (the report's
     * protection evidence for ENCRYPT is blind to ENCRYPT's own protection).
     */
    @Test
    void theOracleRoundSeesAnEncryptThatNeverSeals() {
        Trace trace = SimFixtures.tinyTrace(SimFixtures.SEED);
        SimulationResult real = run(ctx -> new TestXorSealer(ctx.memory()), trace);
        SimulationResult planted = run(ctx -> new NoSealSealer(ctx.memory()), trace);
        assertTrue(planted.prefixReclaims() > 0 && planted.pagesReused() > 0, "the planted level ran its seal and reclaim paths");
        assertEquals(0, real.leakedBytes());
        assertEquals(0, real.dirtyHandOuts());
        assertTrue(planted.leakedBytes() > 0 || planted.dirtyHandOuts() > 0 || planted.foreignResidueHandOuts() > 0,
                "an ENCRYPT that leaves every sealed page in plaintext passes the oracle round exactly as the real one: leaked "
                        + planted.leakedBytes() + " bytes, " + planted.dirtyHandOuts() + " dirty hand-outs, " + planted.prefixReclaims()
                        + " reclaims (real seal: " + real.leakedBytes() + ", " + real.dirtyHandOuts() + ", " + real.prefixReclaims() + ")");
    }
}
