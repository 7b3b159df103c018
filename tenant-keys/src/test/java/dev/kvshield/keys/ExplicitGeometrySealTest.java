package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.geometry.BufferKind;
import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.tenant.TenantRegistry;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.function.BiFunction;
import org.junit.jupiter.api.Test;

/**
 * Sealing a pool whose buffers differ in kind and width (SGLang target and draft pools with scale
 * and indexer buffers): the nonce carries the buffer's number, so no two regions of a sealed page
 * (nor two pages) share a keystream block, even where buffers share a kind and width. A planted
 * sealer that puts the kind in the nonce must be caught.
 */
class ExplicitGeometrySealTest {
    /** Two K buffers, two scale buffers and two draft buffers of equal widths: same-kind collisions are possible. */
    static final PoolGeometry SGLANG_LIKE = PoolGeometry.builder().pageSizeTokens(4).pageCount(5)
            .buffer(BufferKind.K, "target.k_buffer[0]", 32).buffer(BufferKind.V, "target.v_buffer[0]", 32)
            .buffer(BufferKind.SCALE, "target.k_scale_buffer[0]", 16).buffer(BufferKind.SCALE, "target.v_scale_buffer[0]", 16)
            .buffer(BufferKind.INDEX, "target.index_key_cache.buffer[0]", 132)
            .buffer(BufferKind.K, "draft.k_buffer[0]", 32).buffer(BufferKind.V, "draft.v_buffer[0]", 32).build();

    @Test
    void everyBufferOfEverySealedPageHasItsOwnKeystream() {
        assertNull(firstRepeatedBlock((ledger, memory) -> new HostPageSealer(ledger, memory)));
    }

    @Test
    void plantedBugANonceCarryingTheKindRepeatsAKeystream() {
        String repeat = firstRepeatedBlock(PlantedBugs::sealerNoncingByKind);
        assertNotNull(repeat);
        assertTrue(repeat.contains("target.k_buffer[0]") && repeat.contains("draft.k_buffer[0]")
                || repeat.contains("k_scale_buffer") && repeat.contains("v_scale_buffer")
                || repeat.contains("target.v_buffer[0]") && repeat.contains("draft.v_buffer[0]"), repeat);
    }

    /**
     * Seals zeroed pages 1 and 2 (so the bytes are the keystream) and returns the first 64-byte block
     * seen in two regions, naming both, or null when every block is distinct.
     */
    private static String firstRepeatedBlock(BiFunction<SealLedger, PageMemory, PageSealer> sealerOf) {
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        int tenant = tenants.register("acme");
        try (PageMemory memory = OffHeapPageMemory.allocate(SGLANG_LIKE);
                TenantKeyring keyring = TenantKeyring.open(RootKeySource.ephemeral(), "pool-x", 0, tenants)) {
            PageSealer sealer = sealerOf.apply(new SealLedger(keyring, SGLANG_LIKE.pageCount()), memory);
            int[] pages = {1, 2};
            sealer.seal(tenant, pages, new int[] {3, 3}, 0, 2);
            Map<String, String> seen = new HashMap<>();
            int blocks = 0;
            for (int page : pages) {
                for (int b = 0; b < SGLANG_LIKE.bufferCount(); b++) {
                    byte[] region = EncryptFixture.raw(memory, page, b);
                    for (int at = 0; at + 64 <= region.length; at += 64, blocks++) {
                        String block = Arrays.toString(Arrays.copyOfRange(region, at, at + 64));
                        String where = "page " + page + " " + SGLANG_LIKE.labelOf(b) + " block " + at / 64;
                        String before = seen.putIfAbsent(block, where);
                        if (before != null) {
                            return "keystream block repeated: " + before + " and " + where;
                        }
                    }
                }
            }
            assertEquals(2 * (2 + 2 + 1 + 1 + 8 + 2 + 2), blocks, "every full block was compared");
            return null;
        }
    }
}
