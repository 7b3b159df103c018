package dev.kvshield.perf.report;

import dev.kvshield.perf.simulate.Level;
import java.awt.BasicStroke;
import java.awt.Color;
import java.awt.Font;
import java.awt.Graphics2D;
import java.awt.geom.Line2D;
import java.awt.geom.Rectangle2D;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.text.DecimalFormat;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.jfree.chart.ChartFactory;
import org.jfree.chart.ChartUtils;
import org.jfree.chart.JFreeChart;
import org.jfree.chart.axis.CategoryAxis;
import org.jfree.chart.axis.NumberAxis;
import org.jfree.chart.axis.ValueAxis;
import org.jfree.chart.plot.CategoryPlot;
import org.jfree.chart.plot.CombinedDomainCategoryPlot;
import org.jfree.chart.plot.PlotOrientation;
import org.jfree.chart.plot.ValueMarker;
import org.jfree.chart.renderer.category.BarRenderer;
import org.jfree.chart.renderer.category.CategoryItemRendererState;
import org.jfree.chart.renderer.category.StandardBarPainter;
import org.jfree.chart.title.TextTitle;
import org.jfree.chart.ui.RectangleAnchor;
import org.jfree.chart.ui.TextAnchor;
import org.jfree.data.category.CategoryDataset;
import org.jfree.data.category.DefaultCategoryDataset;

/**
 * The report's charts, drawn with JFreeChart as PNG bytes (the JVM must run headless:
 * {@code -Djava.awt.headless=true}). Each bar is a median with a whisker from the smallest to the
 * largest value (over pairs for ratios, over timed runs otherwise), on a white background; the
 * throughput chart draws stock's 1.0 as a line. Every chart carries the machine it came from.
 */
public final class Charts {
    public static final int WIDTH = 900;
    public static final int HEIGHT = 460;
    /** Two stacked panels (p50 above p99). */
    public static final int PANEL_HEIGHT = 640;
    private static final Color[] SERIES = {new Color(0x8fb8e0), new Color(0xf2b880)};
    private static final Color GRID = new Color(0xdddddd);

    private Charts() {}

    /** File name → PNG bytes of every chart of the report. */
    public static Map<String, byte[]> draw(ReportData d) {
        Map<String, byte[]> charts = new LinkedHashMap<>();
        String machine = d.machine().label() + " (" + d.backend() + " backend)";
        double modelStep = d.config().modelStepMillis();

        Bars ratio = new Bars();
        Bars latency = new Bars();
        Bars allocator = new Bars();
        DefaultCategoryDataset bandwidth = new DefaultCategoryDataset();
        for (LevelReport l : d.levels()) {
            if (!l.measured()) {
                continue;
            }
            String name = l.level().label();
            ratio.add("ratio to stock", l.level() == Level.STOCK ? "stock (vs stock)" : name, l.ratioToStock());
            latency.add("p50", name, l.stepP50Millis());
            latency.add("p99", name, l.stepP99Millis());
            AllocatorCost.Share share = l.allocator().shareOfModelStep(modelStep);
            String column = name + "\n" + ReportWriter.percent(share.p50(), 2) + " / " + ReportWriter.percent(share.p99(), 2);
            allocator.add("p50", column, l.allocator().p50Micros());
            allocator.add("p99", column, l.allocator().p99Micros());
            if (l.protectionGBps() != null) {
                String bar = name + "\nlimit: " + l.limitName();
                bandwidth.addValue(l.protectionGBps(), "protection", bar);
                if (l.limitGBps() != null) {
                    bandwidth.addValue(l.limitGBps(), "same-run limit", bar);
                }
            }
        }
        JFreeChart ratioChart = ratio.chart("Serving throughput relative to stock (paired runs)", "tokens/s ÷ paired stock tokens/s",
                machine + "; bar: median, whisker: every pair", "0.000");
        CategoryPlot ratioPlot = (CategoryPlot) ((CombinedDomainCategoryPlot) ratioChart.getPlot()).getSubplots().get(0);
        ValueMarker one = new ValueMarker(1.0, new Color(0x333333), new BasicStroke(1.5f));
        one.setLabel("stock = 1.0");
        one.setLabelAnchor(RectangleAnchor.TOP_RIGHT);
        one.setLabelTextAnchor(TextAnchor.BOTTOM_RIGHT);
        ratioPlot.addRangeMarker(one);
        ratioPlot.getRangeAxis().setRange(0, Math.max(1.1, ratio.maxHigh("ratio to stock") * 1.05));
        charts.put("throughput-ratio.png", png(ratioChart, HEIGHT));
        charts.put("step-latency.png", png(latency.chart("Scheduler step latency (every level's whole step)", "ms",
                machine + "; bar: median over timed runs, whisker: min-max", "0.00"), PANEL_HEIGHT));
        charts.put("allocator-time.png", png(allocator.chart("Allocator time per scheduler step", "µs", machine
                + "\nbar: median over timed runs, whisker: min-max; under each level: share of a " + ReportWriter.fmt(modelStep, 1)
                + " ms model step, p50 / p99", "0.0"), PANEL_HEIGHT));
        if (bandwidth.getColumnCount() > 0) {
            JFreeChart chart = ChartFactory.createBarChart("Protection bandwidth against the same run's limit", null, "GB/s", bandwidth,
                    PlotOrientation.VERTICAL, true, false, false);
            chart.addSubtitle(new TextTitle(machine, new Font(Font.SANS_SERIF, Font.PLAIN, 11)));
            chart.setBackgroundPaint(Color.WHITE);
            BarRenderer renderer = new BarRenderer();
            style(chart.getCategoryPlot(), renderer, SERIES[0]);
            chart.getCategoryPlot().setRenderer(renderer);
            chart.getCategoryPlot().getDomainAxis().setMaximumCategoryLabelLines(2);
            charts.put("protection-bandwidth.png", png(chart, HEIGHT));
        }
        return charts;
    }

    /**
     * Medians as bars, with the [min, max] of each kept for its whisker; one panel per series (p50
     * and p99 differ by orders of magnitude), stacked over one level axis, each scaled to its own
     * whiskers.
     */
    private static final class Bars {
        private final Map<String, DefaultCategoryDataset> series = new LinkedHashMap<>();
        private final Map<String, double[]> ranges = new HashMap<>();

        void add(String name, String column, Spread s) {
            series.computeIfAbsent(name, k -> new DefaultCategoryDataset()).addValue(s.median(), name, column);
            ranges.put(name + '\u0000' + column, new double[] {s.min(), s.max()});
        }

        double maxHigh(String name) {
            double max = 0;
            for (Map.Entry<String, double[]> e : ranges.entrySet()) {
                if (e.getKey().startsWith(name + '\u0000')) {
                    max = Math.max(max, e.getValue()[1]);
                }
            }
            return max;
        }

        int panels() {
            return series.size();
        }

        JFreeChart chart(String title, String unit, String subtitle, String labelFormat) {
            CombinedDomainCategoryPlot plot = new CombinedDomainCategoryPlot(new CategoryAxis());
            plot.setGap(12);
            int i = 0;
            for (Map.Entry<String, DefaultCategoryDataset> e : series.entrySet()) {
                String name = e.getKey();
                NumberAxis axis = new NumberAxis(series.size() > 1 ? name + ", " + unit : unit);
                axis.setRange(0, Math.max(maxHigh(name), 1e-9) * 1.08);
                WhiskerBars renderer = new WhiskerBars(ranges, new DecimalFormat(labelFormat));
                CategoryPlot panel = new CategoryPlot(e.getValue(), null, axis, renderer);
                style(panel, renderer, SERIES[i++ % SERIES.length]);
                plot.add(panel, 1);
            }
            JFreeChart chart = new JFreeChart(title, JFreeChart.DEFAULT_TITLE_FONT, plot, false);
            chart.addSubtitle(new TextTitle(subtitle, new Font(Font.SANS_SERIF, Font.PLAIN, 11)));
            chart.setBackgroundPaint(Color.WHITE);
            CategoryAxis domain = plot.getDomainAxis();
            domain.setTickLabelFont(new Font(Font.SANS_SERIF, Font.PLAIN, 12));
            domain.setMaximumCategoryLabelLines(2);
            return chart;
        }
    }

    /** White background, light grid, flat bars of one colour. */
    private static void style(CategoryPlot plot, BarRenderer renderer, Color colour) {
        plot.setBackgroundPaint(Color.WHITE);
        plot.setRangeGridlinePaint(GRID);
        plot.setOutlineVisible(false);
        renderer.setBarPainter(new StandardBarPainter());
        renderer.setShadowVisible(false);
        renderer.setMaximumBarWidth(0.12);
        renderer.setSeriesPaint(0, colour);
        if (plot.getDataset() != null && plot.getDataset().getRowCount() > 1) {
            renderer.setSeriesPaint(1, SERIES[1]);
        }
    }

    /**
     * A bar renderer that draws a min-max whisker with caps over each bar and writes the median at
     * the bar's top, right of the whisker (where no cap or line crosses it).
     */
    private static final class WhiskerBars extends BarRenderer {
        private static final Font LABEL = new Font(Font.SANS_SERIF, Font.PLAIN, 11);
        private final transient Map<String, double[]> ranges;
        private final DecimalFormat format;

        WhiskerBars(Map<String, double[]> ranges, DecimalFormat format) {
            this.ranges = ranges;
            this.format = format;
        }

        @Override
        public void drawItem(Graphics2D g2, CategoryItemRendererState state, Rectangle2D dataArea, CategoryPlot plot,
                CategoryAxis domainAxis, ValueAxis rangeAxis, CategoryDataset dataset, int row, int column, int pass) {
            super.drawItem(g2, state, dataArea, plot, domainAxis, rangeAxis, dataset, row, column, pass);
            double[] range = ranges.get(dataset.getRowKey(row) + "\u0000" + dataset.getColumnKey(column));
            if (pass != getPassCount() - 1 || range == null) {
                return;
            }
            double x0 = calculateBarW0(plot, plot.getOrientation(), dataArea, domainAxis, state, row, column);
            double x = x0 + state.getBarWidth() / 2;
            double cap = state.getBarWidth() / 4;
            double low = rangeAxis.valueToJava2D(range[0], dataArea, plot.getRangeAxisEdge());
            double high = rangeAxis.valueToJava2D(range[1], dataArea, plot.getRangeAxisEdge());
            g2.setPaint(Color.BLACK);
            g2.setStroke(new BasicStroke(1.2f));
            g2.draw(new Line2D.Double(x, low, x, high));
            g2.draw(new Line2D.Double(x - cap, low, x + cap, low));
            g2.draw(new Line2D.Double(x - cap, high, x + cap, high));
            Number median = dataset.getValue(row, column);
            if (median != null) {
                double top = rangeAxis.valueToJava2D(median.doubleValue(), dataArea, plot.getRangeAxisEdge());
                g2.setFont(LABEL);
                g2.drawString(format.format(median.doubleValue()), (float) (x + cap + 3), (float) (top - 3));
            }
        }
    }

    private static byte[] png(JFreeChart chart, int height) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try {
            ChartUtils.writeChartAsPNG(out, chart, WIDTH, height);
        } catch (IOException e) {
            throw new UncheckedIOException("drawing chart '" + chart.getTitle().getText() + "' failed", e);
        }
        return out.toByteArray();
    }
}
