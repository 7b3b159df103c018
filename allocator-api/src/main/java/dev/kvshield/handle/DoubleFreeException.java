package dev.kvshield.handle;

/**
 * A release of a handle that was already released: the page's generation moved exactly one step
 * past the handle's and nobody owns the page since, or the same handle appears twice in one batch.
 */
public final class DoubleFreeException extends StaleHandleException {
    public DoubleFreeException(int page, int handleGeneration, int currentGeneration, String detail) {
        super("double free: page=" + page + " generation=" + handleGeneration + " current=" + currentGeneration + " ("
                + detail + ")", page, handleGeneration, currentGeneration);
    }
}
