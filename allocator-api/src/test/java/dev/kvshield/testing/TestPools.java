package dev.kvshield.testing;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.pool.KvPagePool;
import dev.kvshield.pool.PoolConfig;
import dev.kvshield.protection.ProtectionLevel;
import java.util.function.UnaryOperator;

/** Tiny pools for tests: a pool plus the memory it runs on, closed together. */
public final class TestPools implements AutoCloseable {
    public final PageMemory memory;
    public final KvPagePool pool;

    public TestPools(PageMemory memory, KvPagePool pool) {
        this.memory = memory;
        this.pool = pool;
    }

    /** Two layers of K and V, 4 tokens of 8 bytes per page, {@code pages} pages with page 0 reserved. */
    public static PoolGeometry tinyGeometry(int pages) {
        return PoolGeometry.builder().mha(2, 1, 4, 2).pageSizeTokens(4).pageCount(pages).build();
    }

    public static TestPools create(int pages, ProtectionLevel level) {
        return create(tinyGeometry(pages), level, UnaryOperator.identity(), UnaryOperator.identity());
    }

    /**
     * A pool over off-heap memory. Levels that require an audit trail get a listener standing in for
     * one, so tests about other things can hand out pages; tests of the audit trail attach a real
     * {@code AuditTrail} to a pool they build themselves ({@link #bare}).
     */
    public static TestPools create(PoolGeometry g, ProtectionLevel level, UnaryOperator<PoolConfig.Builder> config,
            UnaryOperator<PageMemory> wrapMemory) {
        TestPools t = bare(g, level, config, wrapMemory);
        t.pool.attachAuditTrail((type, page, generation, tenant, owner, detail) -> { });
        return t;
    }

    /** A pool over off-heap memory with no audit trail attached. */
    public static TestPools bare(PoolGeometry g, ProtectionLevel level, UnaryOperator<PoolConfig.Builder> config,
            UnaryOperator<PageMemory> wrapMemory) {
        PageMemory memory = wrapMemory.apply(OffHeapPageMemory.allocate(g));
        KvPagePool pool = KvPagePool.create(config.apply(PoolConfig.builder(g).level(level)).build(), memory);
        return new TestPools(memory, pool);
    }

    @Override
    public void close() {
        pool.close();
        memory.close();
    }
}
