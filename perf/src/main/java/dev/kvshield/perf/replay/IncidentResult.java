package dev.kvshield.perf.replay;

import dev.kvshield.perf.simulate.LeakSample;
import dev.kvshield.perf.simulate.Level;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * What a replay found. A response is what a request returned to its client: {@code completed}
 * responses looked like successes, {@code errors} were aborts or error statuses; a request refused by
 * admission counts in {@code rejected} too.
 *
 * @param leakedResponses successful-looking responses that carried another request's bytes
 * @param leakedBytes bytes of other requests' canaries found in responses
 * @param firstLeak who leaked to whom first (tenants and requests, never content), or null
 * @param outcomes per request: how it ended, one line each
 */
public record IncidentResult(String incident, Level level, int requests, int completed, int rejected, int errors, int leakedResponses,
        long leakedBytes, LeakSample firstLeak, Map<String, String> outcomes) {

    public Map<String, Object> toJson() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("incident", incident);
        m.put("level", level.label());
        m.put("requests", requests);
        m.put("completed", completed);
        m.put("rejected", rejected);
        m.put("errors", errors);
        m.put("leakedResponses", leakedResponses);
        m.put("leakedBytes", leakedBytes);
        if (firstLeak == null) {
            m.put("firstLeak", null);
        } else {
            Map<String, Object> f = new LinkedHashMap<>();
            f.put("fromTenant", firstLeak.fromTenant());
            f.put("fromRequest", firstLeak.fromRequest());
            f.put("toTenant", firstLeak.toTenant());
            f.put("toRequest", firstLeak.toRequest());
            f.put("description", firstLeak.describe());
            m.put("firstLeak", f);
        }
        m.put("outcomes", new LinkedHashMap<>(outcomes));
        return m;
    }
}
