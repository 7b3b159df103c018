package dev.kvshield.audit.internal;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The JSON the audit trail needs and no more: string escaping (the rules {@link RecordChain}'s byte
 * encoder also follows), a writer for tool output and a strict parser for reading records back.
 * Numbers parse as {@code Long}; objects keep field order.
 */
public final class Json {
    /**
     * The deepest nesting of objects and arrays the parser accepts: a record nests three levels
     * ({@code pages} entries), and the parser recurses once per level, so a hostile line cannot
     * exhaust the reader's stack.
     */
    public static final int MAX_DEPTH = 64;
    /** The escape of each ASCII character a JSON string cannot hold as is; null for the others. */
    private static final String[] ESCAPES = escapes();

    private Json() {}

    private static String[] escapes() {
        String hex = "0123456789abcdef";
        String[] e = new String[0x80];
        for (char c = 0; c < 0x20; c++) {
            e[c] = "\\u00" + hex.charAt(c >> 4) + hex.charAt(c & 15);
        }
        e['"'] = "\\\"";
        e['\\'] = "\\\\";
        e['\n'] = "\\n";
        e['\r'] = "\\r";
        e['\t'] = "\\t";
        return e;
    }

    /**
     * How a JSON string literal holds {@code c}: its escape sequence, or null when it holds the
     * character as is. The one definition of the escaping both the text and the byte encoder use.
     */
    public static String escape(char c) {
        return c < ESCAPES.length ? ESCAPES[c] : null;
    }

    /** Appends {@code s} as a JSON string literal. */
    public static void string(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            String e = escape(c);
            if (e == null) {
                sb.append(c);
            } else {
                sb.append(e);
            }
        }
        sb.append('"');
    }

    /** Appends any value this class parses (String, Long/Integer, Boolean, List, Map, null). */
    public static void value(StringBuilder sb, Object v) {
        switch (v) {
            case null -> sb.append("null");
            case String s -> string(sb, s);
            case Number n -> sb.append(n.longValue());
            case Boolean b -> sb.append(b.booleanValue());
            case List<?> list -> {
                sb.append('[');
                for (int i = 0; i < list.size(); i++) {
                    if (i > 0) {
                        sb.append(',');
                    }
                    value(sb, list.get(i));
                }
                sb.append(']');
            }
            case Map<?, ?> map -> {
                sb.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : map.entrySet()) {
                    if (!first) {
                        sb.append(',');
                    }
                    first = false;
                    string(sb, e.getKey().toString());
                    sb.append(':');
                    value(sb, e.getValue());
                }
                sb.append('}');
            }
            default -> throw new IllegalArgumentException("not a JSON value: " + v.getClass().getName());
        }
    }

    public static String toJson(Object v) {
        StringBuilder sb = new StringBuilder();
        value(sb, v);
        return sb.toString();
    }

    /**
     * Parses one JSON object.
     *
     * @throws IllegalArgumentException naming the offset of the first syntax error, or of the
     *     object or array nested deeper than {@link #MAX_DEPTH}
     */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) {
        Parser p = new Parser(text);
        p.ws();
        Object v = p.value();
        p.ws();
        if (p.pos != text.length() || !(v instanceof Map)) {
            throw new IllegalArgumentException("not one JSON object (offset " + p.pos + ")");
        }
        return (Map<String, Object>) v;
    }

    private static final class Parser {
        private final String s;
        private int pos;
        /** Objects and arrays open around {@link #pos}. */
        private int depth;

        Parser(String s) {
            this.s = s;
        }

        void ws() {
            while (pos < s.length() && Character.isWhitespace(s.charAt(pos))) {
                pos++;
            }
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("malformed JSON at offset " + pos + ": " + what);
        }

        char peek() {
            if (pos >= s.length()) {
                throw error("unexpected end");
            }
            return s.charAt(pos);
        }

        void expect(char c) {
            if (peek() != c) {
                throw error("expected '" + c + "'");
            }
            pos++;
        }

        /** Enters an object or array at {@link #pos}; {@link #leave} ends it. */
        void enter() {
            if (++depth > MAX_DEPTH) {
                throw error("nested deeper than " + MAX_DEPTH + " objects and arrays");
            }
            pos++;
        }

        <T> T leave(T value) {
            depth--;
            return value;
        }

        Object value() {
            char c = peek();
            switch (c) {
                case '{' -> {
                    enter();
                    Map<String, Object> m = new LinkedHashMap<>();
                    ws();
                    if (peek() == '}') {
                        pos++;
                        return leave(m);
                    }
                    while (true) {
                        ws();
                        String k = str();
                        ws();
                        expect(':');
                        ws();
                        if (m.put(k, value()) != null) {
                            throw error("duplicate key '" + k + "'");
                        }
                        ws();
                        if (peek() == ',') {
                            pos++;
                        } else {
                            expect('}');
                            return leave(m);
                        }
                    }
                }
                case '[' -> {
                    enter();
                    List<Object> l = new ArrayList<>();
                    ws();
                    if (peek() == ']') {
                        pos++;
                        return leave(l);
                    }
                    while (true) {
                        ws();
                        l.add(value());
                        ws();
                        if (peek() == ',') {
                            pos++;
                        } else {
                            expect(']');
                            return leave(l);
                        }
                    }
                }
                case '"' -> {
                    return str();
                }
                default -> {
                    if (s.startsWith("true", pos)) {
                        pos += 4;
                        return Boolean.TRUE;
                    }
                    if (s.startsWith("false", pos)) {
                        pos += 5;
                        return Boolean.FALSE;
                    }
                    if (s.startsWith("null", pos)) {
                        pos += 4;
                        return null;
                    }
                    return number();
                }
            }
        }

        Long number() {
            int start = pos;
            if (pos < s.length() && s.charAt(pos) == '-') {
                pos++;
            }
            while (pos < s.length() && Character.isDigit(s.charAt(pos))) {
                pos++;
            }
            if (pos == start || (pos == start + 1 && s.charAt(start) == '-')) {
                throw error("expected a value");
            }
            try {
                return Long.parseLong(s.substring(start, pos));
            } catch (NumberFormatException e) {
                throw error("integer out of range");
            }
        }

        String str() {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = peek();
                pos++;
                if (c == '"') {
                    return sb.toString();
                }
                if (c < 0x20) {
                    throw error("control character in string");
                }
                if (c != '\\') {
                    sb.append(c);
                    continue;
                }
                char e = peek();
                pos++;
                switch (e) {
                    case '"', '\\', '/' -> sb.append(e);
                    case 'n' -> sb.append('\n');
                    case 'r' -> sb.append('\r');
                    case 't' -> sb.append('\t');
                    case 'b' -> sb.append('\b');
                    case 'f' -> sb.append('\f');
                    case 'u' -> {
                        if (pos + 4 > s.length()) {
                            throw error("short \\u escape");
                        }
                        try {
                            sb.append((char) Integer.parseInt(s.substring(pos, pos + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw error("bad \\u escape");
                        }
                        pos += 4;
                    }
                    default -> throw error("bad escape \\" + e);
                }
            }
        }
    }
}
