package dev.kvshield.keys;

import dev.kvshield.memory.PageMemory;
import dev.kvshield.memory.ForwardingPageMemory;
import java.lang.foreign.MemorySegment;

/**
 * A {@link PageMemory} that is not a {@code HostPageMemory}: it delegates every call, and exposes
 * host regions only when told to (a device-like backend when not).
 */
final class DelegatingMemory extends ForwardingPageMemory {
    private final boolean hostAccessible;

    DelegatingMemory(PageMemory delegate, boolean hostAccessible) {
        super(delegate);
        this.hostAccessible = hostAccessible;
    }

    @Override
    public boolean isHostAccessible() {
        return hostAccessible;
    }

    @Override
    public MemorySegment hostRegion(int page, int buffer) {
        if (!hostAccessible) {
            throw new UnsupportedOperationException(describe() + " has no host-accessible page regions");
        }
        return delegate.hostRegion(page, buffer);
    }

    @Override
    public String describe() {
        return (hostAccessible ? "host-accessible" : "device-like") + " wrapper of " + delegate.describe();
    }
}
