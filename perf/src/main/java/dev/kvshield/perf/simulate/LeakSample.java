package dev.kvshield.perf.simulate;

/**
 * Where a leaked byte came from and who read it: tenants and requests only, never the content.
 *
 * @param position the token position the leaked cell was written at
 * @param buffer the buffer (layer x K/V) it was read from
 */
public record LeakSample(int fromTenant, long fromRequest, int toTenant, long toRequest, int position, int buffer) {
    public String describe() {
        return "tenant " + fromTenant + " request " + fromRequest + " -> tenant " + toTenant + " request " + toRequest
                + " (position " + position + ", buffer " + buffer + ")";
    }
}
