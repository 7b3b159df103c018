package dev.kvshield.perf.workload;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Reads and writes traces as CSV. Columns, in this order, with this header line:
 *
 * <pre>
 * id,tenant,arrival_step,prompt_tokens,output_tokens,prefix_tokens,abort_after_tokens,handoff
 * </pre>
 *
 * {@code prefix_tokens} is 0 for no shared prefix and must be a whole number of pages;
 * {@code abort_after_tokens} is -1 for a request that completes; {@code handoff} is {@code true}
 * or {@code false}. Lines starting with {@code #} and blank lines are ignored. Tenants are
 * numbered from 0; the trace has {@code max(tenant) + 1} tenants.
 */
public final class TraceCsv {
    public static final String HEADER = "id,tenant,arrival_step,prompt_tokens,output_tokens,prefix_tokens,abort_after_tokens,handoff";

    private TraceCsv() {}

    public static Trace read(Path file, int pageSizeTokens) {
        List<String> lines;
        try {
            lines = Files.readAllLines(file);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read trace " + file, e);
        }
        List<TraceRequest> requests = new ArrayList<>();
        int tenants = 0;
        boolean header = false;
        for (int n = 0; n < lines.size(); n++) {
            String line = lines.get(n).trim();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            if (!header) {
                if (!line.equals(HEADER)) {
                    throw new IllegalArgumentException(file + ":" + (n + 1) + ": expected the header '" + HEADER + "', found '" + line + "'");
                }
                header = true;
                continue;
            }
            String[] f = line.split(",", -1);
            if (f.length != 8) {
                throw new IllegalArgumentException(file + ":" + (n + 1) + ": expected 8 columns (" + HEADER + "), found " + f.length);
            }
            try {
                TraceRequest r = new TraceRequest(Integer.parseInt(f[0].trim()), Integer.parseInt(f[1].trim()),
                        Integer.parseInt(f[2].trim()), Integer.parseInt(f[3].trim()), Integer.parseInt(f[4].trim()),
                        Integer.parseInt(f[5].trim()), Integer.parseInt(f[6].trim()), parseBoolean(f[7].trim()));
                if (r.prefixTokens() % pageSizeTokens != 0) {
                    throw new IllegalArgumentException("prefix_tokens=" + r.prefixTokens() + " is not a whole number of "
                            + pageSizeTokens + "-token pages");
                }
                requests.add(r);
                tenants = Math.max(tenants, r.tenant() + 1);
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException(file + ":" + (n + 1) + ": " + e.getMessage(), e);
            }
        }
        if (requests.isEmpty()) {
            throw new IllegalArgumentException(file + ": the trace has no requests");
        }
        return new Trace(requests, tenants, "csv " + file.getFileName());
    }

    private static boolean parseBoolean(String s) {
        if (s.equalsIgnoreCase("true") || s.equals("1")) {
            return true;
        }
        if (s.equalsIgnoreCase("false") || s.equals("0")) {
            return false;
        }
        throw new IllegalArgumentException("handoff must be true or false, found '" + s + "'");
    }

    public static void write(Trace trace, Path file) {
        StringBuilder sb = new StringBuilder(HEADER).append('\n');
        for (TraceRequest r : trace.requests()) {
            sb.append(r.id()).append(',').append(r.tenant()).append(',').append(r.arrivalStep()).append(',').append(r.promptTokens())
                    .append(',').append(r.outputTokens()).append(',').append(r.prefixTokens()).append(',').append(r.abortAfterTokens())
                    .append(',').append(r.handoff()).append('\n');
        }
        try {
            Files.writeString(file, sb);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write trace " + file, e);
        }
    }
}
