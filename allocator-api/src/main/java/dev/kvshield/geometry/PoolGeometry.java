package dev.kvshield.geometry;

import java.util.Arrays;
import java.util.List;

/**
 * The shape of a paged KV pool: {@code layers} layers, each with the same per-layer buffers
 * ({@code K} and {@code V}, or one {@code LATENT} buffer for MLA models), every buffer cut into
 * {@code pageCount} pages of {@code pageSizeTokens} token slots.
 *
 * <p>Buffers are numbered globally: {@code buffer = layer * buffersPerLayer + kindIndex}. A page's
 * bytes in one buffer are contiguous: {@code pageBytes(buffer) = pageSizeTokens *
 * bytesPerToken(buffer)}, at byte offset {@code page * pageBytes(buffer)} of that buffer. Page 0 is
 * reserved by default (SGLang writes dummy outputs of padded tokens there) and never handed out.
 *
 * <p>Immutable and thread-safe. Validated once, in {@link Builder#build()}.
 */
public final class PoolGeometry {
    /** Upper bound on page slots, so slot bitsets and kernel indices stay small. */
    public static final int MAX_PAGE_SIZE_TOKENS = 4096;
    /** Upper bound on layers; real models have at most a few hundred. */
    public static final int MAX_LAYERS = 4096;

    private final int layers;
    private final int pageSizeTokens;
    private final BufferKind[] kinds;
    private final int[] bytesPerTokenByKind;
    private final int pageCount;
    private final boolean pageZeroReserved;

    private PoolGeometry(Builder b) {
        this.layers = b.layers;
        this.pageSizeTokens = b.pageSizeTokens;
        this.kinds = b.kinds.toArray(new BufferKind[0]);
        this.bytesPerTokenByKind = b.bytesPerToken.clone();
        this.pageCount = b.pageCount;
        this.pageZeroReserved = b.pageZeroReserved;
    }

    public static Builder builder() {
        return new Builder();
    }

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

    public int buffersPerLayer() {
        return kinds.length;
    }

    /** Buffers in the whole pool: {@code layers * buffersPerLayer}. */
    public int bufferCount() {
        return layers * kinds.length;
    }

    public int bufferIndex(int layer, int kindIndex) {
        if (layer < 0 || layer >= layers || kindIndex < 0 || kindIndex >= kinds.length) {
            throw new InvalidGeometryException("no buffer for layer=" + layer + " kindIndex=" + kindIndex
                    + " (layers=" + layers + ", buffersPerLayer=" + kinds.length + ")");
        }
        return layer * kinds.length + kindIndex;
    }

    public int layerOf(int buffer) {
        return buffer / kinds.length;
    }

    public BufferKind kindOf(int buffer) {
        return kinds[buffer % kinds.length];
    }

    public int bytesPerToken(int buffer) {
        return bytesPerTokenByKind[buffer % kinds.length];
    }

    /** Bytes of one page in one buffer. */
    public long pageBytes(int buffer) {
        return (long) pageSizeTokens * bytesPerToken(buffer);
    }

    /** Bytes of one whole buffer: {@code pageCount * pageBytes(buffer)}. */
    public long bufferBytes(int buffer) {
        return pageCount * pageBytes(buffer);
    }

    /** Bytes of one page across every layer and buffer. */
    public long pageBytesAllBuffers() {
        long sum = 0;
        for (int bpt : bytesPerTokenByKind) {
            sum += (long) pageSizeTokens * bpt;
        }
        return sum * layers;
    }

    /** Bytes of one token slot across every layer and buffer. */
    public long bytesPerTokenAllBuffers() {
        long sum = 0;
        for (int bpt : bytesPerTokenByKind) {
            sum += bpt;
        }
        return sum * layers;
    }

    /** Token slots the pool can hand out: {@code usablePages * pageSizeTokens}. */
    public long capacityTokens() {
        return (long) usablePages() * pageSizeTokens;
    }

    public List<BufferKind> kinds() {
        return List.of(kinds);
    }

    /** Checks {@code 0 <= page < pageCount}, naming the values if not. */
    public void checkPage(int page) {
        if (page < 0 || page >= pageCount) {
            throw new InvalidGeometryException("page " + page + " out of range [0, " + pageCount + ")");
        }
    }

    /** Checks a buffer index, naming the values if it does not exist. */
    public void checkBuffer(int buffer) {
        if (buffer < 0 || buffer >= bufferCount()) {
            throw new InvalidGeometryException("buffer " + buffer + " out of range [0, " + bufferCount() + ")");
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
            throw new InvalidGeometryException(byteSize + " bytes is not a whole number of " + bpt + "-byte tokens of buffer " + buffer);
        }
        checkSlots(slot, (int) Math.min(byteSize / bpt, Integer.MAX_VALUE));
        return page * pageBytes(buffer) + (long) slot * bpt;
    }

    @Override
    public String toString() {
        return "PoolGeometry[layers=" + layers + ", pageSizeTokens=" + pageSizeTokens + ", buffers=" + Arrays.toString(kinds)
                + ", bytesPerToken=" + Arrays.toString(bytesPerTokenByKind) + ", pageCount=" + pageCount
                + ", pageZeroReserved=" + pageZeroReserved + "]";
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof PoolGeometry g && g.layers == layers && g.pageSizeTokens == pageSizeTokens
                && Arrays.equals(g.kinds, kinds) && Arrays.equals(g.bytesPerTokenByKind, bytesPerTokenByKind)
                && g.pageCount == pageCount && g.pageZeroReserved == pageZeroReserved;
    }

    @Override
    public int hashCode() {
        return ((layers * 31 + pageSizeTokens) * 31 + Arrays.hashCode(bytesPerTokenByKind)) * 31 + pageCount;
    }

    /** Collects and validates a geometry. Not thread-safe. */
    public static final class Builder {
        private int layers = -1;
        private int pageSizeTokens = -1;
        private List<BufferKind> kinds = List.of();
        private int[] bytesPerToken = new int[0];
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

        /** Any per-layer buffer list, each with its own bytes per token. */
        public Builder buffers(List<BufferKind> kinds, int... bytesPerToken) {
            this.kinds = List.copyOf(kinds);
            this.bytesPerToken = bytesPerToken.clone();
            return this;
        }

        public PoolGeometry build() {
            require(layers > 0 && layers <= MAX_LAYERS, "layers must be in [1, " + MAX_LAYERS + "]: layers=" + layers);
            require(pageSizeTokens > 0 && pageSizeTokens <= MAX_PAGE_SIZE_TOKENS,
                    "pageSizeTokens must be in [1, " + MAX_PAGE_SIZE_TOKENS + "]: pageSizeTokens=" + pageSizeTokens);
            require(!kinds.isEmpty(), "a geometry needs at least one buffer per layer (call mha, mla or buffers)");
            require(kinds.size() == bytesPerToken.length, "buffers per layer (" + kinds.size()
                    + ") and bytes-per-token entries (" + bytesPerToken.length + ") differ");
            require(kinds.size() == new java.util.HashSet<>(kinds).size(), "buffer kinds repeat within a layer: " + kinds);
            int first = pageZeroReserved ? 1 : 0;
            require(pageCount > first, "pageCount must leave at least one usable page: pageCount=" + pageCount
                    + " pageZeroReserved=" + pageZeroReserved);
            for (int i = 0; i < bytesPerToken.length; i++) {
                require(bytesPerToken[i] > 0, "bytesPerToken must be positive: " + kinds.get(i) + "=" + bytesPerToken[i]);
                long pageBytes = (long) pageSizeTokens * bytesPerToken[i];
                require(pageBytes <= Integer.MAX_VALUE, "one page of " + kinds.get(i) + " would be " + pageBytes
                        + " bytes, over the " + Integer.MAX_VALUE + "-byte limit");
                require(Math.multiplyHigh(pageBytes, pageCount) == 0 && pageBytes * pageCount > 0,
                        "buffer " + kinds.get(i) + " of " + pageCount + " pages x " + pageBytes + " bytes overflows a long");
            }
            return new PoolGeometry(this);
        }

        private static void require(boolean ok, String message) {
            if (!ok) {
                throw new InvalidGeometryException(message);
            }
        }
    }
}
