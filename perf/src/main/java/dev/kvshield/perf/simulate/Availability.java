package dev.kvshield.perf.simulate;

/**
 * Whether an optional part (a key source, a GPU backend) can be used in this JVM, and if not, why.
 *
 * @param value the part, or {@code null} when unavailable
 * @param reason why it is unavailable (empty when available)
 */
public record Availability<T>(T value, String reason) {
    public static <T> Availability<T> of(T value) {
        return new Availability<>(value, "");
    }

    public static <T> Availability<T> unavailable(String reason) {
        return new Availability<>(null, reason);
    }

    public boolean available() {
        return value != null;
    }
}
