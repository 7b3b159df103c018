package dev.kvshield.keys;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.HostPageMemory;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** Deliberately broken parts that the isolation oracles must catch (test code only). */
final class PlantedBugs {
    private PlantedBugs() {}

    /** A sealer with all the bookkeeping of the real one whose cipher skips the XOR. */
    static PageSealerFactory sealerSkippingTheXor(RootKeySource source) {
        return context -> {
            SealLedger ledger = new SealLedger(TenantKeyring.open(source, context.poolId(), context.rank(), context.tenants()),
                    context.geometry().pageCount());
            return new PageSealer() {
                @Override
                public boolean canSeal(int tenant) {
                    return ledger.canSeal(tenant);
                }

                @Override
                public int seal(int tenant, int[] pages, int[] generations, int offset, int count) {
                    return ledger.beginSeal(tenant, pages, generations, offset, count);
                }

                @Override
                public void unseal(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                    ledger.beginUnseal(tenant, epoch, pages, generations, offset, count);
                }

                @Override
                public boolean isEpochAvailable(int tenant, int epoch) {
                    return ledger.isEpochAvailable(tenant, epoch);
                }

                @Override
                public void shred(int tenant) {
                    ledger.shred(tenant);
                }

                @Override
                public void close() {
                    ledger.keyring().close();
                }
            };
        };
    }

    /** Off-heap page memory whose scrub does nothing: a hand-out that skips the zeroing. */
    static final class MemorySkippingTheScrub extends HostPageMemory {
        private final Arena arena;

        private MemorySkippingTheScrub(PoolGeometry geometry, Arena arena, MemorySegment[] buffers) {
            super(geometry, buffers);
            this.arena = arena;
        }

        static MemorySkippingTheScrub allocate(PoolGeometry geometry) {
            Arena arena = Arena.ofShared();
            MemorySegment[] buffers = new MemorySegment[geometry.bufferCount()];
            for (int b = 0; b < buffers.length; b++) {
                buffers[b] = arena.allocate(geometry.bufferBytes(b), 64);
            }
            return new MemorySkippingTheScrub(geometry, arena, buffers);
        }

        @Override
        public void scrub(int[] pages, int offset, int count) {
            // Planted bug: nothing is zeroed.
        }

        @Override
        public String describe() {
            return "planted bug: memory whose scrub skips the zeroing";
        }

        @Override
        protected void release() {
            arena.close();
        }
    }
}
