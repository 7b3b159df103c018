package dev.kvshield.lease;

import dev.kvshield.KvShieldException;

/** The lease table (or the claim table) has no room for a batch; nothing was minted. The message names the capacity. */
public final class LeaseCapacityException extends KvShieldException {
    public LeaseCapacityException(String message) {
        super(message);
    }
}
