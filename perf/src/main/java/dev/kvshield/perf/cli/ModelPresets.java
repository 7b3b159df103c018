package dev.kvshield.perf.cli;

import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/**
 * KV geometry of a few well-known models (per-layer shape as published in their configs). MHA/GQA
 * models have a K and a V buffer per layer of {@code kvHeads * headDim} elements per token; MLA
 * models one latent buffer of {@code latentDim} elements.
 *
 * @param latentDim 0 for MHA/GQA models
 */
record ModelPresets(String name, int layers, int kvHeads, int headDim, int latentDim, int contextTokens) {
    static final Map<String, ModelPresets> ALL = new LinkedHashMap<>();

    static {
        add(new ModelPresets("llama-3.1-8b", 32, 8, 128, 0, 131_072));
        add(new ModelPresets("llama-3.1-70b", 80, 8, 128, 0, 131_072));
        add(new ModelPresets("mistral-7b", 32, 8, 128, 0, 32_768));
        add(new ModelPresets("qwen2.5-7b", 28, 4, 128, 0, 131_072));
        add(new ModelPresets("qwen2.5-72b", 80, 8, 128, 0, 131_072));
        add(new ModelPresets("deepseek-v3", 61, 0, 0, 576, 163_840));
    }

    private static void add(ModelPresets p) {
        ALL.put(p.name, p);
    }

    static ModelPresets get(String name) {
        ModelPresets p = ALL.get(name == null ? "" : name.trim().toLowerCase(Locale.ROOT));
        if (p == null) {
            throw new Args.UsageException("unknown preset '" + name + "'; allowed: " + String.join(", ", ALL.keySet()));
        }
        return p;
    }

    boolean mla() {
        return latentDim > 0;
    }

    /** Bytes of one token across every layer and buffer at {@code dtypeBytes} per element. */
    long bytesPerToken(int dtypeBytes) {
        long perLayer = mla() ? (long) latentDim * dtypeBytes : 2L * kvHeads * headDim * dtypeBytes;
        return perLayer * layers;
    }

    /** Element size of a dtype name: bf16, fp16, fp8, fp32. */
    static int dtypeBytes(String dtype) {
        return switch (dtype == null ? "" : dtype.trim().toLowerCase(Locale.ROOT)) {
            case "bf16", "fp16", "float16", "bfloat16" -> 2;
            case "fp8", "fp8_e4m3", "fp8_e5m2", "int8" -> 1;
            case "fp32", "float32" -> 4;
            default -> throw new Args.UsageException("unknown dtype '" + dtype + "'; allowed: bf16, fp16, fp8, fp32");
        };
    }
}
