package dev.kvshield.geometry;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;

/**
 * The shape of a paged KV pool: a list of buffers, each cut into {@code pageCount} pages of
 * {@code pageSizeTokens} token slots, each with its own kind, label and bytes per token.
 *
 * <p>Two ways to build one, with the same numbering and page math:
 *
 * <ul>
 *   <li>Layered ({@link Builder#mha}, {@link Builder#mla}, {@link Builder#buffers}): {@code layers}
 *       layers with the same per-layer buffers; {@code buffer = layer * buffersPerLayer +
 *       kindIndex}.
 *   <li>Explicit ({@link Builder#buffer}): any list of buffers, in the order given, with any bytes
 *       per token each (scale and indexer buffers, a draft model's layers of another shape). It
 *       reads as one "layer" holding every buffer: {@code layers() == 1}, {@code buffersPerLayer()
 *       == bufferCount()}, {@link #kinds()} lists every buffer's kind (kinds may repeat).
 * </ul>
 *
 * <p>A page's bytes in one buffer are contiguous: {@code pageBytes(buffer) = pageSizeTokens *
 * bytesPerToken(buffer)}, at byte offset {@code page * pageBytes(buffer)} of that buffer (a
 * token-major {@code (slots, ...)} tensor and a page-major {@code (pages, ...)} one alike). Page 0
 * is reserved by default (SGLang writes dummy outputs of padded tokens there) and never handed out.
 *
 * <p>Immutable and thread-safe. Validated once, in {@link Builder#build()}.
 */
public final class PoolGeometry {
    /** Upper bound on page slots, so slot bitsets and kernel indices stay small. */
    public static final int MAX_PAGE_SIZE_TOKENS = 4096;
    /** Upper bound on layers; real models have at most a few hundred. */
    public static final int MAX_LAYERS = 4096;
    /** Upper bound on buffers in one pool (a few hundred layers times a few tensors each, target and draft). */
    public static final int MAX_BUFFERS = 65_536;
    /** Upper bound on a buffer label's length in characters. */
    public static final int MAX_LABEL_CHARS = 200;

    private final int layers;
    private final int buffersPerLayer;
    private final int pageSizeTokens;
    private final BufferKind[] kindByBuffer;
    private final String[] labelByBuffer;
    private final int[] bytesPerTokenByBuffer;
    private final int pageCount;
    private final boolean pageZeroReserved;
    private final boolean layered;

    private PoolGeometry(Builder b, BufferKind[] kinds, String[] labels, int[] bytesPerToken, int layers) {
        this.layers = layers;
        this.buffersPerLayer = kinds.length / layers;
        this.pageSizeTokens = b.pageSizeTokens;
        this.kindByBuffer = kinds;
        this.labelByBuffer = labels;
        this.bytesPerTokenByBuffer = bytesPerToken;
        this.pageCount = b.pageCount;
        this.pageZeroReserved = b.pageZeroReserved;
        this.layered = b.explicit.isEmpty();
    }

    public static Builder builder() {
        return new Builder();
    }

    /** Layers of a layered geometry; 1 for an explicit buffer list. */
    public int layers() {
        return layers;
    }

    public int pageSizeTokens() {
        return pageSizeTokens;
    }

    /** Pages per buffer, the reserved page 0 included. */
    public int pageCount() {
        return pageCount;
    }

    public boolean pageZeroReserved() {
        return pageZeroReserved;
    }

    /** The first page that may be handed out: 1 if page 0 is reserved, else 0. */
    public int firstUsablePage() {
        return pageZeroReserved ? 1 : 0;
    }

    /** Pages that may ever be handed out. */
    public int usablePages() {
        return pageCount - firstUsablePage();
    }

    /** Buffers per layer; every buffer for an explicit buffer list. */
    public int buffersPerLayer() {
        return buffersPerLayer;
    }

    /** Buffers in the whole pool: {@code layers * buffersPerLayer}. */
    public int bufferCount() {
        return kindByBuffer.length;
    }

    /** Whether this geometry was built layer by layer (same buffers in every layer). */
    public boolean isLayered() {
        return layered;
    }

    public int bufferIndex(int layer, int kindIndex) {
        if (layer < 0 || layer >= layers || kindIndex < 0 || kindIndex >= buffersPerLayer) {
            throw new InvalidGeometryException("no buffer for layer=" + layer + " kindIndex=" + kindIndex
                    + " (layers=" + layers + ", buffersPerLayer=" + buffersPerLayer + ")");
        }
        return layer * buffersPerLayer + kindIndex;
    }

    public int layerOf(int buffer) {
        checkBuffer(buffer);
        return buffer / buffersPerLayer;
    }

    public BufferKind kindOf(int buffer) {
        checkBuffer(buffer);
        return kindByBuffer[buffer];
    }

    /** The buffer's label: what the engine calls it (e.g. {@code target.k_scale_buffer[3]}), or {@code layer L KIND}. */
    public String labelOf(int buffer) {
        checkBuffer(buffer);
        return labelByBuffer[buffer];
    }

    /** Index, label and kind of a buffer, for messages: {@code buffer 5 (layer 2 V)}. */
    public String describeBuffer(int buffer) {
        return "buffer " + buffer + " (" + labelOf(buffer) + (layered ? "" : " " + kindByBuffer[buffer]) + ")";
    }

    public int bytesPerToken(int buffer) {
        checkBuffer(buffer);
        return bytesPerTokenByBuffer[buffer];
    }

    /** Bytes of one page in one buffer. */
    public long pageBytes(int buffer) {
        return (long) pageSizeTokens * bytesPerToken(buffer);
    }

    /** Bytes of one whole buffer: {@code pageCount * pageBytes(buffer)}. */
    public long bufferBytes(int buffer) {
        return pageCount * pageBytes(buffer);
    }

    /** Bytes of one page across every buffer. */
    public long pageBytesAllBuffers() {
        return pageSizeTokens * bytesPerTokenAllBuffers();
    }

    /** Bytes of the largest page of any buffer. */
    public long maxPageBytes() {
        int max = 0;
        for (int bpt : bytesPerTokenByBuffer) {
            max = Math.max(max, bpt);
        }
        return (long) pageSizeTokens * max;
    }

    /** Bytes of one token slot across every buffer. */
    public long bytesPerTokenAllBuffers() {
        long sum = 0;
        for (int bpt : bytesPerTokenByBuffer) {
            sum += bpt;
        }
        return sum;
    }

    /** Token slots the pool can hand out: {@code usablePages * pageSizeTokens}. */
    public long capacityTokens() {
        return (long) usablePages() * pageSizeTokens;
    }

    /** Kinds of one layer's buffers (layered), or of every buffer in order (explicit). */
    public List<BufferKind> kinds() {
        return List.of(Arrays.copyOf(kindByBuffer, buffersPerLayer));
    }

    /** Checks {@code 0 <= page < pageCount}, naming the values if not. */
    public void checkPage(int page) {
        if (page < 0 || page >= pageCount) {
            throw new InvalidGeometryException("page " + page + " out of range [0, " + pageCount + ")");
        }
    }

    /** Checks a buffer index, naming the values if it does not exist. */
    public void checkBuffer(int buffer) {
        if (buffer < 0 || buffer >= kindByBuffer.length) {
            throw new InvalidGeometryException("buffer " + buffer + " out of range [0, " + kindByBuffer.length + ")");
        }
    }

    /** Checks a token slot range {@code [slot, slot + count)} inside one page. */
    public void checkSlots(int slot, int count) {
        if (slot < 0 || count < 0 || slot > pageSizeTokens - count) {
            throw new InvalidGeometryException("slots [" + slot + ", " + ((long) slot + count)
                    + ") outside a page of " + pageSizeTokens + " token slots");
        }
    }

    /**
     * The byte offset, inside buffer {@code buffer}, of token slot {@code slot} of page {@code page},
     * after checking that {@code byteSize} bytes are a whole number of that buffer's tokens and fit in
     * the page from that slot. Every backend's slot read and write goes through this one check.
     */
    public long slotByteOffset(int page, int buffer, int slot, long byteSize) {
        checkPage(page);
        checkBuffer(buffer);
        int bpt = bytesPerToken(buffer);
        if (byteSize % bpt != 0) {
            throw new InvalidGeometryException(byteSize + " bytes is not a whole number of " + bpt + "-byte tokens of "
                    + describeBuffer(buffer));
        }
        checkSlots(slot, (int) Math.min(byteSize / bpt, Integer.MAX_VALUE));
        return page * pageBytes(buffer) + (long) slot * bpt;
    }

    @Override
    public String toString() {
        String buffers;
        if (layered) {
            buffers = "layers=" + layers + ", buffers=" + kinds() + ", bytesPerToken="
                    + Arrays.toString(Arrays.copyOf(bytesPerTokenByBuffer, buffersPerLayer));
        } else {
            StringBuilder s = new StringBuilder("buffers=[");
            for (int b = 0; b < kindByBuffer.length; b++) {
                s.append(b == 0 ? "" : ", ").append(labelByBuffer[b]).append(' ').append(kindByBuffer[b]).append(' ')
                        .append(bytesPerTokenByBuffer[b]);
            }
            buffers = s.append(']').toString();
        }
        return "PoolGeometry[" + buffers + ", pageSizeTokens=" + pageSizeTokens + ", pageCount=" + pageCount
                + ", pageZeroReserved=" + pageZeroReserved + "]";
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof PoolGeometry g && g.layers == layers && g.pageSizeTokens == pageSizeTokens && g.layered == layered
                && Arrays.equals(g.kindByBuffer, kindByBuffer) && Arrays.equals(g.bytesPerTokenByBuffer, bytesPerTokenByBuffer)
                && Arrays.equals(g.labelByBuffer, labelByBuffer) && g.pageCount == pageCount
                && g.pageZeroReserved == pageZeroReserved;
    }

    @Override
    public int hashCode() {
        return ((layers * 31 + pageSizeTokens) * 31 + Arrays.hashCode(bytesPerTokenByBuffer)) * 31 + pageCount;
    }

    /**
     * Collects and validates a geometry: either layered ({@link #layers}, {@link #mha}, {@link #mla},
     * {@link #buffers}) or an explicit list ({@link #buffer}), never both. Not thread-safe.
     */
    public static final class Builder {
        private int layers = -1;
        private int pageSizeTokens = -1;
        private List<BufferKind> kinds = List.of();
        private int[] bytesPerToken = new int[0];
        private final List<Spec> explicit = new ArrayList<>();
        private int pageCount = -1;
        private boolean pageZeroReserved = true;

        private Builder() {}

        public Builder layers(int layers) {
            this.layers = layers;
            return this;
        }

        public Builder pageSizeTokens(int pageSizeTokens) {
            this.pageSizeTokens = pageSizeTokens;
            return this;
        }

        /** Pages per buffer, page 0 included. */
        public Builder pageCount(int pageCount) {
            this.pageCount = pageCount;
            return this;
        }

        public Builder pageZeroReserved(boolean reserved) {
            this.pageZeroReserved = reserved;
            return this;
        }

        /** Multi-head attention: a K and a V buffer per layer of {@code kvHeads * headDim * dtypeBytes} bytes per token. */
        public Builder mha(int layers, int kvHeads, int headDim, int dtypeBytes) {
            long bpt = (long) kvHeads * headDim * dtypeBytes;
            require(kvHeads > 0 && headDim > 0 && dtypeBytes > 0 && bpt <= Integer.MAX_VALUE,
                    "MHA needs positive kvHeads, headDim, dtypeBytes with a product that fits an int: kvHeads=" + kvHeads
                            + " headDim=" + headDim + " dtypeBytes=" + dtypeBytes);
            this.layers = layers;
            this.kinds = List.of(BufferKind.K, BufferKind.V);
            this.bytesPerToken = new int[] {(int) bpt, (int) bpt};
            return this;
        }

        /** Multi-head latent attention: one latent buffer per layer of {@code latentDim * dtypeBytes} bytes per token. */
        public Builder mla(int layers, int latentDim, int dtypeBytes) {
            long bpt = (long) latentDim * dtypeBytes;
            require(latentDim > 0 && dtypeBytes > 0 && bpt <= Integer.MAX_VALUE,
                    "MLA needs positive latentDim and dtypeBytes: latentDim=" + latentDim + " dtypeBytes=" + dtypeBytes);
            this.layers = layers;
            this.kinds = List.of(BufferKind.LATENT);
            this.bytesPerToken = new int[] {(int) bpt};
            return this;
        }

        /** Any per-layer buffer list, each with its own bytes per token, repeated in every layer. */
        public Builder buffers(List<BufferKind> kinds, int... bytesPerToken) {
            this.kinds = List.copyOf(kinds);
            this.bytesPerToken = bytesPerToken.clone();
            return this;
        }

        /**
         * Appends one buffer to an explicit list: its kind, a label unique in the pool (what the
         * engine calls it; it appears in messages) and its bytes per token.
         */
        public Builder buffer(BufferKind kind, String label, int bytesPerToken) {
            explicit.add(new Spec(kind, label, bytesPerToken));
            return this;
        }

        public PoolGeometry build() {
            require(pageSizeTokens > 0 && pageSizeTokens <= MAX_PAGE_SIZE_TOKENS,
                    "pageSizeTokens must be in [1, " + MAX_PAGE_SIZE_TOKENS + "]: pageSizeTokens=" + pageSizeTokens);
            int first = pageZeroReserved ? 1 : 0;
            require(pageCount > first, "pageCount must leave at least one usable page: pageCount=" + pageCount
                    + " pageZeroReserved=" + pageZeroReserved);
            BufferKind[] kindByBuffer;
            String[] labelByBuffer;
            int[] bptByBuffer;
            int layerCount;
            if (explicit.isEmpty()) {
                require(layers > 0 && layers <= MAX_LAYERS, "layers must be in [1, " + MAX_LAYERS + "]: layers=" + layers);
                require(!kinds.isEmpty(), "a geometry needs at least one buffer per layer (call mha, mla, buffers or buffer)");
                require(kinds.size() == bytesPerToken.length, "buffers per layer (" + kinds.size()
                        + ") and bytes-per-token entries (" + bytesPerToken.length + ") differ");
                require(kinds.size() == new HashSet<>(kinds).size(), "buffer kinds repeat within a layer: " + kinds);
                require((long) layers * kinds.size() <= MAX_BUFFERS, layers + " layers x " + kinds.size()
                        + " buffers is over the " + MAX_BUFFERS + "-buffer limit");
                int n = layers * kinds.size();
                kindByBuffer = new BufferKind[n];
                labelByBuffer = new String[n];
                bptByBuffer = new int[n];
                for (int b = 0; b < n; b++) {
                    kindByBuffer[b] = kinds.get(b % kinds.size());
                    labelByBuffer[b] = "layer " + b / kinds.size() + " " + kindByBuffer[b];
                    bptByBuffer[b] = bytesPerToken[b % kinds.size()];
                }
                layerCount = layers;
            } else {
                require(layers == -1 && kinds.isEmpty(), "a geometry is either layered (layers, mha, mla, buffers) or an explicit"
                        + " buffer list (buffer), not both: layers=" + layers + " kinds=" + kinds + " explicit buffers="
                        + explicit.size());
                require(explicit.size() <= MAX_BUFFERS, explicit.size() + " buffers is over the " + MAX_BUFFERS + "-buffer limit");
                int n = explicit.size();
                kindByBuffer = new BufferKind[n];
                labelByBuffer = new String[n];
                bptByBuffer = new int[n];
                HashSet<String> seen = new HashSet<>();
                for (int b = 0; b < n; b++) {
                    Spec e = explicit.get(b);
                    require(e.kind() != null, "buffer " + b + " has no kind");
                    String label = e.label();
                    require(label != null && !label.isBlank() && label.length() <= MAX_LABEL_CHARS
                                    && label.chars().allMatch(c -> c >= 0x20 && c < 0x7f),
                            "buffer " + b + " needs a printable ASCII label of 1 to " + MAX_LABEL_CHARS + " characters: "
                                    + (label == null ? "null" : "'" + label.replaceAll("[^\\x20-\\x7e]", "?") + "'"));
                    require(seen.add(label), "buffer label '" + label + "' repeats (buffer " + b + ")");
                    kindByBuffer[b] = e.kind();
                    labelByBuffer[b] = label;
                    bptByBuffer[b] = e.bytesPerToken();
                }
                layerCount = 1;
            }
            for (int b = 0; b < bptByBuffer.length; b++) {
                require(bptByBuffer[b] > 0, "bytesPerToken must be positive: " + labelByBuffer[b] + "=" + bptByBuffer[b]);
                long pageBytes = (long) pageSizeTokens * bptByBuffer[b];
                require(pageBytes <= Integer.MAX_VALUE, "one page of " + labelByBuffer[b] + " would be " + pageBytes
                        + " bytes, over the " + Integer.MAX_VALUE + "-byte limit");
                require(Math.multiplyHigh(pageBytes, pageCount) == 0 && pageBytes * pageCount > 0,
                        "buffer " + labelByBuffer[b] + " of " + pageCount + " pages x " + pageBytes + " bytes overflows a long");
            }
            return new PoolGeometry(this, kindByBuffer, labelByBuffer, bptByBuffer, layerCount);
        }

        private record Spec(BufferKind kind, String label, int bytesPerToken) {}

        private static void require(boolean ok, String message) {
            if (!ok) {
                throw new InvalidGeometryException(message);
            }
        }
    }
}
