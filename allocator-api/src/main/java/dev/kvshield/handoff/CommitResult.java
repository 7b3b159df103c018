package dev.kvshield.handoff;

/**
 * The verdict on a reservation at commit.
 *
 * @param outcome {@link HandoffOutcome#COMMITTED} or the refusal
 * @param sequenceTokens tokens the request needs
 * @param coveredTokens tokens the sender published as sent
 * @param firstBadPage index (within the reservation) of the first page not written by this transfer, or -1
 * @param message one line for the client's abort and the logs, naming the numbers
 */
public record CommitResult(HandoffOutcome outcome, long sequenceTokens, long coveredTokens, int firstBadPage, String message) {
    public boolean committed() {
        return outcome == HandoffOutcome.COMMITTED;
    }
}
