package dev.kvshield.keys;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.memory.PageMemory;
import java.lang.foreign.MemorySegment;

/**
 * A {@link PageMemory} that is not a {@code HostPageMemory}: it delegates every call, and exposes
 * host regions only when told to (a device-like backend when not).
 */
final class DelegatingMemory implements PageMemory {
    private final PageMemory delegate;
    private final boolean hostAccessible;

    DelegatingMemory(PageMemory delegate, boolean hostAccessible) {
        this.delegate = delegate;
        this.hostAccessible = hostAccessible;
    }

    @Override
    public PoolGeometry geometry() {
        return delegate.geometry();
    }

    @Override
    public void scrub(int[] pages, int offset, int count) {
        delegate.scrub(pages, offset, count);
    }

    @Override
    public int verifyZero(int[] pages, int offset, int count, int[] dirtyOut) {
        return delegate.verifyZero(pages, offset, count, dirtyOut);
    }

    @Override
    public void write(int page, int buffer, int slot, MemorySegment src) {
        delegate.write(page, buffer, slot, src);
    }

    @Override
    public void read(int page, int buffer, int slot, MemorySegment dst) {
        delegate.read(page, buffer, slot, dst);
    }

    @Override
    public boolean isHostAccessible() {
        return hostAccessible;
    }

    @Override
    public MemorySegment hostRegion(int page, int buffer) {
        return hostAccessible ? delegate.hostRegion(page, buffer) : PageMemory.super.hostRegion(page, buffer);
    }

    @Override
    public String describe() {
        return (hostAccessible ? "host-accessible" : "device-like") + " wrapper of " + delegate.describe();
    }

    @Override
    public void close() {
        delegate.close();
    }
}
