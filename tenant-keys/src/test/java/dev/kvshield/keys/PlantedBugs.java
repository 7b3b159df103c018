package dev.kvshield.keys;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.memory.HostPageMemory;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.protection.PageSealerFactory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** Deliberately broken parts that the isolation oracles must catch (test code only). */
final class PlantedBugs {
    private PlantedBugs() {}

    private static SealLedger ledger(RootKeySource source, PageSealerFactory.Context context) {
        return new SealLedger(TenantKeyring.open(source, context.poolId(), context.rank(), context.tenants()),
                context.geometry().pageCount());
    }

    /** A sealer with all the bookkeeping of the real one whose cipher skips the XOR. */
    static PageSealerFactory sealerSkippingTheXor(RootKeySource source) {
        return context -> new LedgerPageSealer(ledger(source, context)) {
            @Override
            protected void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                // Planted bug: the bytes stay as they are.
            }

            @Override
            protected void zeroPages(int[] pages, int offset, int count) {
                context.memory().scrub(pages, offset, count);
            }
        };
    }

    /**
     * A sealer that builds its nonce without the page generation: every re-seal of a page under
     * one key reuses the keystream.
     */
    static PageSealerFactory sealerIgnoringTheGeneration(RootKeySource source) {
        return context -> new LedgerPageSealer(ledger(source, context)) {
            @Override
            protected void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                PageMemory memory = context.memory();
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment key = arena.allocate(TenantKeyring.KEY_BYTES);
                    ledger.keyring().copyKeyForKernelLaunchDangerously(tenant, epoch, key);
                    for (int i = offset; i < offset + count; i++) {
                        for (int b = 0; b < memory.geometry().bufferCount(); b++) {
                            // Planted bug: generation word fixed at 0.
                            ChaCha20.xor(key, new int[] {pages[i], 0, b}, 0, memory.hostRegion(pages[i], b));
                        }
                    }
                    key.fill((byte) 0);
                }
            }

            @Override
            protected void zeroPages(int[] pages, int offset, int count) {
                context.memory().scrub(pages, offset, count);
            }
        };
    }

    /**
     * A sealer whose nonce carries the buffer's kind instead of its number: two buffers of one kind
     * (a target and a draft K buffer, two scale buffers) of one page share a keystream.
     */
    static LedgerPageSealer sealerNoncingByKind(SealLedger ledger, PageMemory memory) {
        return new LedgerPageSealer(ledger) {
            @Override
            protected void xorKeystream(int tenant, int epoch, int[] pages, int[] generations, int offset, int count) {
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment key = arena.allocate(TenantKeyring.KEY_BYTES);
                    ledger.keyring().copyKeyForKernelLaunchDangerously(tenant, epoch, key);
                    for (int i = offset; i < offset + count; i++) {
                        for (int b = 0; b < memory.geometry().bufferCount(); b++) {
                            // Planted bug: the buffer word is the kind, not the buffer number.
                            int kind = memory.geometry().kindOf(b).ordinal();
                            ChaCha20.xor(key, new int[] {pages[i], generations[i], kind}, 0, memory.hostRegion(pages[i], b));
                        }
                    }
                    key.fill((byte) 0);
                }
            }

            @Override
            protected void zeroPages(int[] pages, int offset, int count) {
                memory.scrub(pages, offset, count);
            }
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
        public int scrubAndVerify(int[] pages, int offset, int count, int[] dirtyOut) {
            // The same planted bug on the fused path: nothing is zeroed; the verify is the real one.
            return verifyZero(pages, offset, count, dirtyOut);
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
