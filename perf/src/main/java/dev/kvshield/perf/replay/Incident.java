package dev.kvshield.perf.replay;

import dev.kvshield.perf.simulate.Level;
import dev.kvshield.protection.PageSealerFactory;

/** A named incident that can be replayed under {@code stock} or any kvshield level. */
public interface Incident {
    String name();

    /** One line: what happened in production. */
    String description();

    /**
     * Replays the incident on fresh pools.
     *
     * @param sealer the key source for ENCRYPT (ignored by other levels; required for ENCRYPT)
     */
    IncidentResult replay(Level level, PageSealerFactory sealer);
}
