package dev.kvshield.perf.jmh;

import dev.kvshield.geometry.PoolGeometry;
import dev.kvshield.keys.HostPageSealer;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.keys.SealLedger;
import dev.kvshield.keys.TenantKeyring;
import dev.kvshield.keys.cipher.ChaCha20;
import dev.kvshield.memory.offheap.OffHeapPageMemory;
import dev.kvshield.tenant.TenantRegistry;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.security.GeneralSecurityException;
import java.util.concurrent.TimeUnit;
import javax.crypto.Cipher;
import javax.crypto.spec.ChaCha20ParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * Seal throughput of the CPU page sealer against the same run's raw ChaCha20 on one contiguous
 * buffer, and the alternatives it was chosen over. Every benchmark transforms the same bytes per
 * operation: {@code batchPages} pages of a 4-layer K/V geometry, each buffer region
 * {@code regionKiB} KiB, so a page is {@code 8 * regionKiB} KiB and an operation
 * {@code batchPages * 8 * regionKiB} KiB; GB/s = bytes per op / ns per op. Run with
 * {@code -prof gc}: the chosen path must allocate ~0 B/op.
 *
 * <ul>
 *   <li>{@code sealBatch}: {@link HostPageSealer#seal} (ledger check, then ChaCha20 over every
 *       region, in place on off-heap memory).
 *   <li>{@code rawChaCha20Contiguous}: {@link ChaCha20#xor} over one contiguous segment of the
 *       same size (the machine's ChaCha20 limit for this implementation).
 *   <li>{@code jdkCipherHeapScratch}: the JDK's ChaCha20 {@link Cipher} per region through one
 *       reused heap array (copy in, init, doFinal, copy out).
 *   <li>{@code jdkCipherDirectBuffer}: the JDK cipher straight on direct {@code ByteBuffer}
 *       views of each region.
 * </ul>
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 2, time = 1)
@Measurement(iterations = 3, time = 1)
@Fork(value = 1, jvmArgsAppend = {"--enable-native-access=ALL-UNNAMED", "--add-modules=jdk.incubator.vector",
        "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED"})
public class SealBenchmark {
    private static final int LAYERS = 4;
    private static final int PAGE_SIZE_TOKENS = 16;

    @Param({"4", "16", "64"})
    int regionKiB;

    @Param({"16"})
    int batchPages;

    private OffHeapPageMemory memory;
    private TenantKeyring keyring;
    private HostPageSealer sealer;
    private int tenant;
    private int[] pages;
    private int[] generations;
    private Arena arena;
    private MemorySegment contiguous;
    private MemorySegment key;
    private Cipher cipher;
    private SecretKeySpec jdkKey;
    private byte[] scratch;
    private byte[] nonce;
    private int jdkGeneration;

    @Setup(Level.Trial)
    public void setUp() throws GeneralSecurityException {
        int bytesPerToken = regionKiB * 1024 / PAGE_SIZE_TOKENS;
        PoolGeometry g = PoolGeometry.builder().mha(LAYERS, 1, bytesPerToken, 1).pageSizeTokens(PAGE_SIZE_TOKENS)
                .pageCount(batchPages + 1).build();
        memory = OffHeapPageMemory.allocate(g);
        TenantRegistry tenants = new TenantRegistry((name, policy) -> { });
        tenant = tenants.register("bench");
        keyring = TenantKeyring.open(RootKeySource.ephemeral(), "bench-pool", 0, tenants);
        sealer = new HostPageSealer(new SealLedger(keyring, g.pageCount()), memory);
        pages = new int[batchPages];
        generations = new int[batchPages];
        for (int i = 0; i < batchPages; i++) {
            pages[i] = i + 1;
        }
        arena = Arena.ofShared();
        contiguous = arena.allocate((long) batchPages * g.pageBytesAllBuffers(), 64);
        key = arena.allocate(ChaCha20.KEY_BYTES);
        keyring.copyKeyForKernelLaunchDangerously(tenant, keyring.currentEpoch(tenant), key);
        cipher = Cipher.getInstance("ChaCha20");
        jdkKey = new SecretKeySpec(key.toArray(ValueLayout.JAVA_BYTE), "ChaCha20");
        scratch = new byte[regionKiB * 1024];
        nonce = new byte[12];
    }

    @Benchmark
    public int sealBatch() {
        for (int i = 0; i < batchPages; i++) {
            generations[i]++;
        }
        return sealer.seal(tenant, pages, generations, 0, batchPages);
    }

    @Benchmark
    public MemorySegment rawChaCha20Contiguous() {
        ChaCha20.xor(key, 1, 2, 3, 0, contiguous, 0, contiguous.byteSize());
        return contiguous;
    }

    @Benchmark
    public int jdkCipherHeapScratch() throws GeneralSecurityException {
        int generation = ++jdkGeneration;
        int n = 0;
        for (int page : pages) {
            for (int b = 0; b < memory.geometry().bufferCount(); b++) {
                MemorySegment region = memory.hostRegion(page, b);
                int length = (int) region.byteSize();
                MemorySegment.copy(region, ValueLayout.JAVA_BYTE, 0, scratch, 0, length);
                cipher.init(Cipher.ENCRYPT_MODE, jdkKey, new ChaCha20ParameterSpec(nonce(page, generation, b), 0));
                n += cipher.doFinal(scratch, 0, length, scratch, 0);
                MemorySegment.copy(scratch, 0, region, ValueLayout.JAVA_BYTE, 0, length);
            }
        }
        return n;
    }

    @Benchmark
    public int jdkCipherDirectBuffer() throws GeneralSecurityException {
        int generation = ++jdkGeneration;
        int n = 0;
        for (int page : pages) {
            for (int b = 0; b < memory.geometry().bufferCount(); b++) {
                ByteBuffer region = memory.hostRegion(page, b).asByteBuffer();
                cipher.init(Cipher.ENCRYPT_MODE, jdkKey, new ChaCha20ParameterSpec(nonce(page, generation, b), 0));
                n += cipher.doFinal(region.duplicate(), region);
            }
        }
        return n;
    }

    private byte[] nonce(int page, int generation, int buffer) {
        ByteBuffer.wrap(nonce).order(java.nio.ByteOrder.LITTLE_ENDIAN).putInt(page).putInt(generation).putInt(buffer);
        return nonce;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        sealer.close();
        memory.close();
        key.fill((byte) 0);
        arena.close();
    }
}
