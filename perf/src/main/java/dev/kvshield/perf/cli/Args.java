package dev.kvshield.perf.cli;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Parsed {@code --name value} and {@code --flag} options plus positional arguments, checked against
 * the options a command accepts; errors name the bad option and list the allowed ones.
 */
final class Args {
    private final Map<String, String> values = new LinkedHashMap<>();
    private final List<String> positional = new ArrayList<>();

    /**
     * @param withValue options that take a value
     * @param flags options that take none
     */
    Args(String command, String[] args, Set<String> withValue, Set<String> flags) {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("--")) {
                positional.add(a);
                continue;
            }
            String name = a.substring(2);
            String value = null;
            int eq = name.indexOf('=');
            if (eq >= 0) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            }
            if (flags.contains(name) && value == null) {
                values.put(name, "true");
            } else if (withValue.contains(name)) {
                if (value == null) {
                    if (i + 1 >= args.length) {
                        throw new UsageException(command + ": option --" + name + " needs a value");
                    }
                    value = args[++i];
                }
                values.put(name, value);
            } else {
                List<String> allowed = new ArrayList<>();
                withValue.stream().sorted().forEach(o -> allowed.add("--" + o + " VALUE"));
                flags.stream().sorted().forEach(o -> allowed.add("--" + o));
                throw new UsageException(command + ": unknown option '" + a + "'; allowed: " + String.join(", ", allowed));
            }
        }
    }

    boolean has(String name) {
        return values.containsKey(name);
    }

    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    int getInt(String name, int fallback) {
        String v = values.get(name);
        if (v == null) {
            return fallback;
        }
        try {
            return Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            throw new UsageException("--" + name + " must be an integer, not '" + v + "'");
        }
    }

    long getLong(String name, long fallback) {
        String v = values.get(name);
        if (v == null) {
            return fallback;
        }
        try {
            return Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            throw new UsageException("--" + name + " must be an integer, not '" + v + "'");
        }
    }

    double getDouble(String name, double fallback) {
        String v = values.get(name);
        if (v == null) {
            return fallback;
        }
        try {
            return Double.parseDouble(v.trim());
        } catch (NumberFormatException e) {
            throw new UsageException("--" + name + " must be a number, not '" + v + "'");
        }
    }

    static final int MAX_DECIMAL_SCALE = 100;

    /**
     * A decimal option read exactly as written (no binary rounding), or {@code fallback} when absent;
     * at most {@value #MAX_DECIMAL_SCALE} digits either side of the point (so arithmetic on it stays small).
     */
    BigDecimal getDecimal(String name, BigDecimal fallback) {
        String v = values.get(name);
        if (v == null) {
            return fallback;
        }
        BigDecimal d;
        try {
            d = new BigDecimal(v.trim());
        } catch (NumberFormatException e) {
            throw new UsageException("--" + name + " must be a decimal number, not '" + v + "'");
        }
        if (Math.abs(d.stripTrailingZeros().scale()) > MAX_DECIMAL_SCALE) {
            throw new UsageException("--" + name + " must be a decimal number within " + MAX_DECIMAL_SCALE + " digits of the point, not '"
                    + v + "'");
        }
        return d;
    }

    List<String> positional() {
        return positional;
    }

    /** A command-line mistake: printed with the usage, exit code 64. */
    static final class UsageException extends RuntimeException {
        UsageException(String message) {
            super(message);
        }
    }
}
