package dev.kvshield.handoff;

import dev.kvshield.geometry.PoolGeometry;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A transport between two pools in one process (a tensor copy): reads through the sender's reader
 * claims, writes through the receiver's writer claims, and publishes what it sent as coverage. For
 * tests, the simulation and incident replays; engines bring their own transport.
 */
public final class LocalTransport {
    private LocalTransport() {}

    /**
     * Copies tokens {@code [0, tokens)} of every buffer from the sender's pages to the receiver's
     * reserved pages and records them as sent.
     *
     * @return the tokens sent
     */
    public static long copy(HandoffSender sender, HandoffSender.Transfer transfer, HandoffReceiver receiver, Reservation reservation,
            PoolGeometry geometry, long tokens) {
        int pageSize = geometry.pageSizeTokens();
        try (Arena arena = Arena.ofConfined()) {
            for (int b = 0; b < geometry.bufferCount(); b++) {
                MemorySegment page = arena.allocate(geometry.pageBytes(b));
                for (int i = 0; (long) i * pageSize < tokens; i++) {
                    int slots = (int) Math.min(pageSize, tokens - (long) i * pageSize);
                    MemorySegment part = page.asSlice(0, (long) slots * geometry.bytesPerToken(b));
                    sender.read(transfer, i, b, 0, part);
                    receiver.write(reservation, i, b, 0, part);
                }
            }
        }
        sender.markSent(transfer, tokens);
        return tokens;
    }
}
