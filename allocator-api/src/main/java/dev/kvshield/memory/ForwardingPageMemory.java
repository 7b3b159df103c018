package dev.kvshield.memory;

import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.MemorySegment;

/**
 * A backend that delegates every call: the base of decorators that change one operation (fault
 * injection in the fuzz harness, planted-bug backends in tests). Thread-safety is the delegate's.
 */
public class ForwardingPageMemory implements PageMemory {
    protected final PageMemory delegate;

    public ForwardingPageMemory(PageMemory delegate) {
        this.delegate = delegate;
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
        return delegate.isHostAccessible();
    }

    @Override
    public MemorySegment hostRegion(int page, int buffer) {
        return delegate.hostRegion(page, buffer);
    }

    @Override
    public String describe() {
        return "forwarding(" + delegate.describe() + ")";
    }

    @Override
    public void close() {
        delegate.close();
    }

    /** Planted bug: a backend whose scrub does nothing (the page keeps its old owner's bytes). */
    public static PageMemory skippingScrub(PageMemory delegate) {
        return new ForwardingPageMemory(delegate) {
            @Override
            public void scrub(int[] pages, int offset, int count) {}
        };
    }
}
