package dev.kvshield.perf.report;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Writes a report's files into a directory: {@code report.json}, {@code report.md}, a
 * self-contained {@code report.html} (charts embedded as base64 PNG) and the chart PNGs.
 */
public final class ReportWriter {
    private ReportWriter() {}

    /** Writes every file; returns the paths written. */
    public static List<Path> write(ReportData d, Path dir) {
        try {
            Files.createDirectories(dir);
            Map<String, byte[]> charts = Charts.draw(d);
            List<Path> written = new java.util.ArrayList<>();
            for (Map.Entry<String, byte[]> c : charts.entrySet()) {
                written.add(Files.write(dir.resolve(c.getKey()), c.getValue()));
            }
            written.add(Files.writeString(dir.resolve("report.json"), Json.write(ReportJson.tree(d))));
            written.add(Files.writeString(dir.resolve("report.md"), markdown(d, charts)));
            written.add(Files.writeString(dir.resolve("report.html"), html(d, charts)));
            return written;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write the report into " + dir, e);
        }
    }

    static String fmt(double v, int decimals) {
        return String.format(Locale.ROOT, "%." + decimals + "f", v);
    }

    static String spread(Spread s, int decimals) {
        return fmt(s.median(), decimals) + " [" + fmt(s.min(), decimals) + ", " + fmt(s.max(), decimals) + "]";
    }

    static String percent(double fraction, int decimals) {
        return fmt(100 * fraction, decimals) + "%";
    }

    /** "median [min, max] ±x%", and what it means for stock (its pairs are stock against stock). */
    private static String ratioCell(LevelReport l) {
        String cell = spread(l.ratioToStock(), 3) + " ±" + percent(l.ratioToStock().halfRangeFraction(), 1);
        if (l.level() == dev.kvshield.perf.simulate.Level.STOCK) {
            return cell + " (stock vs stock: the method's own noise)";
        }
        return cell + (l.withinNoise() ? " within noise" : "");
    }

    private static String shareCell(LevelReport l, double modelStepMillis) {
        AllocatorCost.Share s = l.allocator().shareOfModelStep(modelStepMillis);
        return percent(s.p50(), 2) + " / " + percent(s.p99(), 2);
    }

    private static String modelStep(ReportData d) {
        return fmt(d.config().modelStepMillis(), d.config().modelStepMillis() == Math.rint(d.config().modelStepMillis()) ? 0 : 2) + " ms";
    }

    private static String bandwidthCell(LevelReport l) {
        if (l.protectionGBps() == null) {
            return "-";
        }
        String s = fmt(l.protectionGBps(), 2);
        if (l.limitGBps() != null) {
            s += " of " + fmt(l.limitGBps(), 2) + " (" + l.limitName() + ", " + fmt(100 * l.protectionGBps() / l.limitGBps(), 0) + "%)";
        } else if (l.limitName() != null) {
            s += " (" + l.limitName() + " limit not measured)";
        }
        return s;
    }

    /** The figures table as rows of cells (header first), shared by Markdown and HTML. */
    static List<List<String>> table(ReportData d) {
        List<List<String>> rows = new java.util.ArrayList<>();
        List<String> header = List.of("level", "tokens/s", "ratio to stock", "step p50 ms", "step p99 ms", "allocator µs/step p50",
                "allocator µs/step p99", "of a " + modelStep(d) + " model step (p50 / p99)", "protected MB/s", "protection GB/s",
                "pages reused", "prefix reclaims", "leaks", "residue pages");
        rows.add(header);
        for (LevelReport l : d.levels()) {
            if (!l.measured()) {
                List<String> row = new java.util.ArrayList<>(List.of(l.level().label(), "skipped: " + l.skipReason()));
                while (row.size() < header.size()) {
                    row.add("");
                }
                rows.add(row);
                continue;
            }
            rows.add(List.of(l.level().label(), spread(l.tokensPerSecond(), 0), ratioCell(l), spread(l.stepP50Millis(), 2),
                    spread(l.stepP99Millis(), 2), spread(l.allocator().p50Micros(), 1), spread(l.allocator().p99Micros(), 1),
                    shareCell(l, d.config().modelStepMillis()), fmt(l.bytesProtectedPerSecond() / 1e6, 1), bandwidthCell(l),
                    Long.toString(l.oracle().pagesReused()), Long.toString(l.oracle().prefixReclaims()),
                    Integer.toString(l.oracle().leakedRequests()), Long.toString(l.oracle().dirtyHandOuts())));
        }
        return rows;
    }

    /**
     * What {@code report} prints on the terminal when it is done: per level the ratio to stock with
     * its spread, the allocator's time per step and its share of the model step, aligned in
     * columns, then one line on the run (time, load, warm-up).
     */
    public static String terminalSummary(ReportData d) {
        List<List<String>> rows = new java.util.ArrayList<>();
        rows.add(List.of("level", "ratio to stock", "±", "allocator µs/step p50", "p99", "of a " + modelStep(d) + " step p50", "p99"));
        for (LevelReport l : d.levels()) {
            if (!l.measured()) {
                rows.add(List.of(l.level().label(), "skipped: " + l.skipReason(), "", "", "", "", ""));
                continue;
            }
            AllocatorCost.Share share = l.allocator().shareOfModelStep(d.config().modelStepMillis());
            String ratio = fmt(l.ratioToStock().median(), 3) + (l.level() == dev.kvshield.perf.simulate.Level.STOCK ? " (noise floor)"
                    : l.withinNoise() ? " within noise" : "");
            rows.add(List.of(l.level().label(), ratio, percent(l.ratioToStock().halfRangeFraction(), 1),
                    fmt(l.allocator().p50Micros().median(), 1), fmt(l.allocator().p99Micros().median(), 1), percent(share.p50(), 2),
                    percent(share.p99(), 2)));
        }
        int[] width = new int[rows.get(0).size()];
        for (List<String> row : rows) {
            for (int i = 0; i < row.size(); i++) {
                width[i] = Math.max(width[i], row.get(i).length());
            }
        }
        StringBuilder sb = new StringBuilder();
        for (List<String> row : rows) {
            StringBuilder line = new StringBuilder();
            for (int i = 0; i < row.size(); i++) {
                String cell = row.get(i);
                line.append(i == 0 || i == 1 ? cell + " ".repeat(width[i] - cell.length()) : " ".repeat(width[i] - cell.length()) + cell)
                        .append("  ");
            }
            sb.append(line.toString().stripTrailing()).append('\n');
        }
        sb.append(runLine(d)).append('\n');
        String unexercised = noReuseWarning(d);
        return (unexercised == null ? sb : sb.append(unexercised).append('\n')).toString();
    }

    /**
     * A warning naming the levels whose oracle round reused no page (their leak and residue figures
     * say nothing about reuse), or null when every measured level's did.
     */
    static String noReuseWarning(ReportData d) {
        List<String> levels = new java.util.ArrayList<>();
        for (LevelReport l : d.levels()) {
            if (l.measured() && l.oracle().pagesReused() == 0) {
                levels.add(l.level().label());
            }
        }
        return levels.isEmpty() ? null : "Warning: the oracle round reused no pages under " + String.join(", ", levels)
                + ": its leak and residue figures there exercised no page reuse.";
    }

    /** One sentence on the run: pairs, time, warm-up, load, JIT and GC during the timed rounds. */
    static String runLine(ReportData d) {
        ReportData.Method m = d.method();
        String load = m.loadBefore() < 0 ? "load average unknown"
                : "load average " + fmt(m.loadBefore(), 2) + " before, " + fmt(m.loadAfter(), 2) + " after the timed rounds";
        String jit = m.timed().compileMillis() < 0 ? "JIT time not monitored" : m.timed().compileMillis() + " ms of JIT compilation";
        return d.config().rounds() + " paired rounds in " + fmt(m.timedSeconds(), 0) + " s of " + fmt(d.elapsedSeconds(), 0)
                + " s, after " + m.warmupRounds() + " warm-up pass(es)" + (m.warmupRounds() == 0 ? ""
                        : m.warmupQuiet() ? " (JIT quiet)" : " (JIT still compiling: " + percent(Math.max(0, m.lastWarmupCompileShare()), 0)
                                + " of the last pass)")
                + "; " + load + "; during the timed rounds " + jit + ", " + m.timed().gcCount() + " GC(s) taking "
                + m.timed().gcMillis() + " ms.";
    }

    /** Incident replays as rows (header first): per incident, per level, leaked responses and errors. */
    static List<List<String>> incidentTable(ReportData d) {
        List<List<String>> rows = new java.util.ArrayList<>();
        List<String> header = new java.util.ArrayList<>(List.of("incident"));
        Map<String, Map<String, String>> cells = new java.util.LinkedHashMap<>();
        for (dev.kvshield.perf.replay.IncidentResult r : d.incidents()) {
            if (!header.contains(r.level().label())) {
                header.add(r.level().label());
            }
            cells.computeIfAbsent(r.incident(), k -> new java.util.LinkedHashMap<>()).put(r.level().label(),
                    r.leakedResponses() + " leaked / " + r.errors() + " errors");
        }
        rows.add(header);
        cells.forEach((incident, byLevel) -> {
            List<String> row = new java.util.ArrayList<>(List.of(incident));
            for (int i = 1; i < header.size(); i++) {
                row.add(byLevel.getOrDefault(header.get(i), ""));
            }
            rows.add(row);
        });
        return rows;
    }

    static List<List<String>> jmhTable(ReportData d) {
        List<List<String>> rows = new java.util.ArrayList<>();
        rows.add(List.of("benchmark", "params", "score", "unit", "B/op (-prof gc)"));
        for (Map<String, Object> r : d.jmh()) {
            Object alloc = r.get("allocatedBytesPerOp");
            rows.add(List.of(String.valueOf(r.get("benchmark")), String.valueOf(r.get("params")), fmt((Double) r.get("score"), 1),
                    String.valueOf(r.get("unit")), alloc == null ? "-" : fmt((Double) alloc, 2)));
        }
        return rows;
    }

    private static List<String> notes(ReportData d) {
        List<String> notes = new java.util.ArrayList<>();
        notes.add("Machine: " + d.machine().label() + "; backend " + d.backend() + " (" + d.memoryDescription() + ").");
        notes.add("Geometry: " + d.config().geometryNote() + "; " + d.config().geometry().pageCount() + " pages of "
                + d.config().geometry().pageBytesAllBuffers() / 1024 + " KiB.");
        notes.add("Trace: " + d.config().trace().source() + ", " + d.config().trace().requests().size() + " requests, "
                + d.config().trace().tenants() + " tenants, " + d.config().trace().totalTokens() + " tokens; seed " + d.config().seed()
                + ".");
        notes.add("Method: " + ReportJson.pairing(d.config().turnSteps()) + ". Ratios are the median over the pairs with"
                + " their spread, " + ReportJson.SPREAD_RULE + "; every other figure is the median with [min, max] over the"
                + " level's timed runs. A ratio whose range contains 1 is marked \"within noise\": not a cost. Stock's own row"
                + " pairs stock with stock, so its spread is the method's noise on this machine at this load.");
        notes.add("Run: " + runLine(d) + " Warm-up runs every level alone, at least " + d.config().warmupRounds() + " pass(es),"
                + " more while the JIT compiled for over " + percent(ReportRunner.JIT_QUIET_SHARE, 0) + " of a pass, at most "
                + d.config().maxWarmupRounds() + ".");
        notes.add("Allocator µs/step: per scheduler step, the time spent inside the allocator's calls (allocate, release with its"
                + " protection, reclaim, readers, the step boundary with the audit trail's hand-off or write, handoff control), not reading or writing"
                + " KV (the model's work); per timed run the p50 and p99 over steps, median [min, max] over runs. Timed by: "
                + d.method().allocatorTiming() + ". \"Of a model step\" divides the medians by a " + modelStep(d)
                + " model step (--model-step-ms; default: a decode step of an 8B model on one GPU) to translate the figure to"
                + " your hardware.");
        notes.add("Levels: none = every guard, no scrub; zero = scrub on release; encrypt = seal with the tenant's ChaCha20"
                + " keystream, zero at hand-out to others; compliance = scrub, verify every byte zero, and a hash-chained,"
                + " signed audit record of every page event written to disk (the trail's writer thread encodes and writes a step's"
                + " records while the next step runs, after steps of 500 µs or more; the figures hold what the scheduler thread spends and waits for, and the"
                + " next step boundary waits for the writer). Reads and writes move every buffer of a page in one call (one"
                + " guard check per page, as an attention pass over the page's layers).");
        notes.add("Leaks and residue come from a separate oracle round per level, the first warm-up pass (the byte oracles never"
                + " run in timed rounds):"
                + " leaks = requests that read another request's canary; residue pages = pages handed out holding old data, plus"
                + " pages whose seal completed with their tenant's plaintext still in them (encrypt, checked at rest). Before the"
                + " trace the round hands every page out once, writes it and releases it, so every page the trace gets is reused"
                + " (encrypt hands out never-used pages before sealed ones and would otherwise reuse none on a large pool)."
                + " Under stock and none, residue is expected (no scrub); under none the guards keep every leak out.");
        String unexercised = noReuseWarning(d);
        if (unexercised != null) {
            notes.add(unexercised);
        }
        notes.add("Same-run limits: contiguous fill " + spread(d.fillGBps(), 2) + " GB/s"
                + (d.chacha20GBps() == null ? "" : "; raw ChaCha20 " + spread(d.chacha20GBps(), 2) + " GB/s") + ".");
        d.skipped().forEach((what, why) -> notes.add("Skipped " + what + ": " + why));
        return notes;
    }

    static String markdown(ReportData d, Map<String, byte[]> charts) {
        StringBuilder sb = new StringBuilder("# kvshield protection-level report\n\n");
        sb.append("What each protection level costs against `stock`, a plain shared pool modelled on SGLang's allocator,"
                + " on this geometry, trace and machine, in one run.\n\n");
        markdownTable(sb, table(d));
        sb.append('\n');
        for (String n : notes(d)) {
            sb.append("- ").append(n).append('\n');
        }
        sb.append("\n## Incident replays\n\nLeaked responses (responses that looked like successes and carried another"
                + " request's bytes) and requests that ended in errors, per level. Stock must leak, or the replay could not"
                + " see the threat; every kvshield level must not.\n\n");
        markdownTable(sb, incidentTable(d));
        if (!d.jmh().isEmpty()) {
            sb.append("\n## JMH results folded in\n\n");
            markdownTable(sb, jmhTable(d));
        }
        sb.append('\n');
        for (String name : charts.keySet()) {
            sb.append("![").append(name).append("](").append(name).append(")\n\n");
        }
        return sb.toString();
    }

    static String html(ReportData d, Map<String, byte[]> charts) {
        StringBuilder sb = new StringBuilder("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                + "<title>kvshield protection-level report</title><style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
                + "table{border-collapse:collapse}td,th{border:1px solid #999;padding:4px 8px;text-align:right}"
                + "td:first-child,th:first-child{text-align:left}img{max-width:100%}</style></head><body>\n");
        sb.append("<h1>kvshield protection-level report</h1>\n<p>What each protection level costs against <code>stock</code>,"
                + " a plain shared pool modelled on SGLang's allocator, on this geometry, trace and machine, in one run.</p>\n");
        htmlTable(sb, table(d));
        sb.append("<ul>\n");
        for (String n : notes(d)) {
            sb.append("<li>").append(escape(n)).append("</li>\n");
        }
        sb.append("</ul>\n<h2>Incident replays</h2>\n<p>Leaked responses and requests ended in errors, per level: stock"
                + " must leak (the replay sees the threat), every kvshield level must not.</p>\n");
        htmlTable(sb, incidentTable(d));
        if (!d.jmh().isEmpty()) {
            sb.append("<h2>JMH results folded in</h2>\n");
            htmlTable(sb, jmhTable(d));
        }
        for (Map.Entry<String, byte[]> c : charts.entrySet()) {
            sb.append("<p><img alt=\"").append(escape(c.getKey())).append("\" src=\"data:image/png;base64,")
                    .append(Base64.getEncoder().encodeToString(c.getValue())).append("\"></p>\n");
        }
        return sb.append("</body></html>\n").toString();
    }

    /** Rows (header first) as a Markdown table. */
    private static void markdownTable(StringBuilder sb, List<List<String>> rows) {
        for (int i = 0; i < rows.size(); i++) {
            sb.append("| ").append(String.join(" | ", rows.get(i))).append(" |\n");
            if (i == 0) {
                sb.append("|").append(" --- |".repeat(rows.get(0).size())).append('\n');
            }
        }
    }

    /** Rows (header first) as an HTML table. */
    private static void htmlTable(StringBuilder sb, List<List<String>> rows) {
        sb.append("<table>\n");
        for (int i = 0; i < rows.size(); i++) {
            String cell = i == 0 ? "th" : "td";
            sb.append("<tr>");
            for (String c : rows.get(i)) {
                sb.append('<').append(cell).append('>').append(escape(c)).append("</").append(cell).append('>');
            }
            sb.append("</tr>\n");
        }
        sb.append("</table>\n");
    }

    static String escape(String s) {
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\"", "&quot;");
    }
}
