package dev.kvshield.perf.cli;

import dev.kvshield.perf.report.Json;
import dev.kvshield.perf.replay.Incident;
import dev.kvshield.perf.replay.IncidentResult;
import dev.kvshield.perf.replay.Incidents;
import dev.kvshield.perf.simulate.Availability;
import dev.kvshield.perf.simulate.Level;
import dev.kvshield.perf.simulate.Sealers;
import dev.kvshield.protection.PageSealerFactory;
import java.io.PrintStream;
import java.util.Set;

/**
 * {@code replay-incident NAME --level LEVEL [--json]}: replays a named incident and prints its JSON
 * summary (with {@code --json}, nothing else). Exit code 0 whenever the replay ran, whatever it
 * found; 2 when the level cannot run here (ENCRYPT without a key source).
 */
final class ReplayCommand {
    private ReplayCommand() {}

    static int run(String[] argv, PrintStream out, PrintStream err, Availability<PageSealerFactory> sealer) {
        Args a = new Args("replay-incident", argv, Set.of("level"), Set.of("json"));
        if (a.positional().size() != 1) {
            throw new Args.UsageException("replay-incident needs exactly one incident name; known: "
                    + String.join(", ", Incidents.all().stream().map(Incident::name).toList()));
        }
        if (!a.has("level")) {
            throw new Args.UsageException("replay-incident needs --level stock|none|zero|encrypt|compliance");
        }
        Incident incident = Incidents.named(a.positional().get(0));
        Level level = Level.parse(a.get("level", ""));
        if (level == Level.ENCRYPT && !sealer.available()) {
            err.println("kvshield: level encrypt cannot run here: " + sealer.reason());
            return 2;
        }
        IncidentResult r = incident.replay(level, sealer.value());
        if (!a.has("json")) {
            out.println(incident.name() + " under " + level.label() + ": " + incident.description());
            out.println(r.leakedResponses() == 0 ? "no response carried another request's data"
                    : r.leakedResponses() + " response(s) carried another request's data (first: " + r.firstLeak().describe() + ")");
        }
        out.print(Json.write(r.toJson()));
        return 0;
    }

    static int run(String[] argv, PrintStream out, PrintStream err) {
        return run(argv, out, err, Sealers.hostSealer());
    }
}
