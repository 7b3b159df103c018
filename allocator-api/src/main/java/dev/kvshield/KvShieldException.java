package dev.kvshield;

/**
 * Root of every exception kvshield throws for misuse or a violated invariant.
 *
 * <p>Expected outcomes (an exhausted pool, a sealed page that is gone) are values, never
 * exceptions. Every subclass names the offending values in its message and never carries key
 * material or KV content.
 */
public class KvShieldException extends RuntimeException {
    public KvShieldException(String message) {
        super(message);
    }

    public KvShieldException(String message, Throwable cause) {
        super(message, cause);
    }
}
