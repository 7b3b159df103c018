package dev.kvshield.handle;

import dev.kvshield.KvShieldException;

/**
 * A handle whose generation is not its page's current one: use after free, a late write, or a
 * page that was retired. The message names page, handle generation and current generation.
 */
public class StaleHandleException extends KvShieldException {
    private final int page;
    private final int handleGeneration;
    private final int currentGeneration;

    public StaleHandleException(int page, int handleGeneration, int currentGeneration, String state) {
        this("stale handle: page=" + page + " generation=" + handleGeneration + " current=" + currentGeneration
                + " state=" + state, page, handleGeneration, currentGeneration);
    }

    protected StaleHandleException(String message, int page, int handleGeneration, int currentGeneration) {
        super(message);
        this.page = page;
        this.handleGeneration = handleGeneration;
        this.currentGeneration = currentGeneration;
    }

    public int page() {
        return page;
    }

    public int handleGeneration() {
        return handleGeneration;
    }

    public int currentGeneration() {
        return currentGeneration;
    }
}
