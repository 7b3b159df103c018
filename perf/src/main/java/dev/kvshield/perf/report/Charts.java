package dev.kvshield.perf.report;

import java.awt.Color;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.LinkedHashMap;
import java.util.Map;
import org.jfree.chart.ChartFactory;
import org.jfree.chart.ChartUtils;
import org.jfree.chart.JFreeChart;
import org.jfree.chart.plot.PlotOrientation;
import org.jfree.chart.title.TextTitle;
import org.jfree.data.category.DefaultCategoryDataset;

/**
 * The report's charts, drawn with JFreeChart as PNG bytes (the JVM must run headless:
 * {@code -Djava.awt.headless=true}). Every chart carries the machine it came from.
 */
public final class Charts {
    public static final int WIDTH = 800;
    public static final int HEIGHT = 420;

    private Charts() {}

    /** File name → PNG bytes of every chart of the report. */
    public static Map<String, byte[]> draw(ReportData d) {
        Map<String, byte[]> charts = new LinkedHashMap<>();
        String machine = d.machine().label() + " (" + d.backend() + " backend)";

        DefaultCategoryDataset ratio = new DefaultCategoryDataset();
        DefaultCategoryDataset latency = new DefaultCategoryDataset();
        DefaultCategoryDataset bandwidth = new DefaultCategoryDataset();
        for (LevelReport l : d.levels()) {
            if (!l.measured()) {
                continue;
            }
            String name = l.level().label();
            ratio.addValue(l.ratioToStock().median(), "median", name);
            ratio.addValue(l.ratioToStock().min(), "min", name);
            ratio.addValue(l.ratioToStock().max(), "max", name);
            latency.addValue(l.stepP50Millis().median(), "p50", name);
            latency.addValue(l.stepP99Millis().median(), "p99", name);
            if (l.protectionGBps() != null) {
                bandwidth.addValue(l.protectionGBps(), "protection", name);
                if (l.limitGBps() != null) {
                    bandwidth.addValue(l.limitGBps(), "same-run limit (" + l.limitName() + ")", name);
                }
            }
        }
        charts.put("throughput-ratio.png", png(bar("Serving throughput relative to stock (same rounds)", "level",
                "tokens/s ÷ stock tokens/s", ratio, machine)));
        charts.put("step-latency.png", png(bar("Scheduler step latency (median over rounds)", "level", "milliseconds", latency,
                machine)));
        if (bandwidth.getColumnCount() > 0) {
            charts.put("protection-bandwidth.png", png(bar("Protection bandwidth against the same run's limit", "level", "GB/s",
                    bandwidth, machine)));
        }
        return charts;
    }

    private static JFreeChart bar(String title, String category, String value, DefaultCategoryDataset data, String machine) {
        JFreeChart chart = ChartFactory.createBarChart(title, category, value, data, PlotOrientation.VERTICAL, true, false, false);
        chart.addSubtitle(new TextTitle("measured on " + machine));
        chart.setBackgroundPaint(Color.WHITE);
        return chart;
    }

    private static byte[] png(JFreeChart chart) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try {
            ChartUtils.writeChartAsPNG(out, chart, WIDTH, HEIGHT);
        } catch (IOException e) {
            throw new UncheckedIOException("drawing chart '" + chart.getTitle().getText() + "' failed", e);
        }
        return out.toByteArray();
    }
}
