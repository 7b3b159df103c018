package dev.kvshield.perf.replay;

import java.util.List;

/** The named incidents {@code ./kvshield replay-incident NAME} knows. */
public final class Incidents {
    private Incidents() {}

    public static List<Incident> all() {
        return List.of(new OversizedHandoff(), new LateWriter(), new LeaseExpiry());
    }

    /** The incident called {@code name}; the error lists the known names. */
    public static Incident named(String name) {
        for (Incident i : all()) {
            if (i.name().equals(name)) {
                return i;
            }
        }
        throw new IllegalArgumentException("unknown incident '" + name + "'; allowed: "
                + String.join(", ", all().stream().map(Incident::name).toList()));
    }
}
