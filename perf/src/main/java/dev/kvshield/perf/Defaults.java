package dev.kvshield.perf;

/**
 * Every default of the lab in one place: the fixed seed, the simulated geometry, the synthetic
 * trace and the report's rounds. Command-line options override them; nothing else hard-codes them.
 *
 * <p>The default geometry keeps one layer of a Llama-3-8B-class model (8 KV heads x 128 x bf16,
 * 16-token pages) and scales the layer count down to {@value #LAYERS}: every byte the simulation
 * moves (writes, attention reads, scrubs, seals) scales with the layer count, so same-run ratios do
 * not depend on it, and a 2-core machine finishes the report in about two minutes.
 */
public final class Defaults {
    /** The seed of every random choice in a default run. */
    public static final long SEED = 20_260_415L;

    public static final int LAYERS = 2;
    public static final int KV_HEADS = 8;
    public static final int HEAD_DIM = 128;
    public static final int DTYPE_BYTES = 2;
    public static final int PAGE_SIZE_TOKENS = 16;
    /** Pool pages (page 0 included): 1024 pages of 128 KiB = 128 MiB of KV. */
    public static final int POOL_PAGES = 1024;

    public static final int TENANTS = 6;
    public static final int REQUESTS = 48;
    /** Mean new requests per scheduler step (Poisson arrivals). */
    public static final double ARRIVALS_PER_STEP = 0.5;
    public static final String PROMPT_TOKENS = "lognormal:384:0.6";
    public static final String OUTPUT_TOKENS = "lognormal:48:0.5";
    /** Tokens of each tenant's shared prefix (a system prompt), page-aligned. */
    public static final int PREFIX_TOKENS = 128;
    /** Share of requests that start with their tenant's shared prefix. */
    public static final double PREFIX_FRACTION = 0.7;
    /** Share of requests the client aborts mid-decode. */
    public static final double ABORT_FRACTION = 0.05;
    /** Share of requests served through a prefill→decode handoff (disaggregated serving). */
    public static final double HANDOFF_FRACTION = 0.25;
    /** Longest prompt a request may have, in tokens. */
    public static final int MAX_PROMPT_TOKENS = 4096;

    /** Most requests decoding at once (the engine's running batch). */
    public static final int MAX_RUNNING = 16;
    /** Most prompt tokens prefilled in one step. */
    public static final int PREFILL_TOKENS_PER_STEP = 2048;
    /** Tenant prefixes kept resident at once; the rest are evicted (and, under ENCRYPT, sealed). */
    public static final int RESIDENT_PREFIXES = 3;

    /**
     * Timed rounds in a default report; each round pairs every level with its own stock runs, in two
     * legs (four runs per level per round).
     */
    public static final int ROUNDS = 3;
    /** The fewest warm-up passes over every level before timing (more while the JIT is busy). */
    public static final int WARMUP_ROUNDS = 2;
    /**
     * The model step the allocator's time per step is compared with: a decode step of an 8B model
     * on one GPU, in milliseconds.
     */
    public static final double MODEL_STEP_MILLIS = 10;
    /** Timed rounds with {@code --full}. */
    public static final int FULL_ROUNDS = 8;
    /** Requests per trace with {@code --full}. */
    public static final int FULL_REQUESTS = 96;

    private Defaults() {}
}
