package dev.kvshield.tenant;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * The tenants a pool knows: dense int ids (0, 1, 2, ...) assigned at registration, each with a
 * stable name (the key-derivation identity) and a {@link TenantPolicy}.
 *
 * <p>Thread-safe. Lookups by id are lock-free reads of an array published on registration, so hot
 * paths may call {@link #check} and {@link #policy} freely.
 *
 * <p>Implementation notes: registration copies the id-indexed arrays (copy-on-write); tenants are
 * never removed, so an id is never reused for another tenant.
 */
public final class TenantRegistry {
    private final Map<String, Integer> idsByName = new HashMap<>();
    private volatile String[] names = new String[0];
    private volatile TenantPolicy[] policies = new TenantPolicy[0];
    private final Validator validator;

    /** Checks a policy at registration, e.g. that ENCRYPT has a key source. */
    @FunctionalInterface
    public interface Validator {
        void validate(String name, TenantPolicy policy);
    }

    public TenantRegistry(Validator validator) {
        this.validator = validator;
    }

    /**
     * Registers a tenant and returns its id; registering an existing name with an equal policy
     * returns the existing id.
     *
     * @throws IllegalArgumentException for a blank name, a name that is not well-formed text (an
     *     unpaired surrogate, a control character) or an existing name with another policy
     */
    public synchronized int register(String name, TenantPolicy policy) {
        if (name == null || name.isBlank() || name.length() > 256) {
            throw new IllegalArgumentException("tenant name must be 1..256 non-blank characters: '" + name + "'");
        }
        checkWellFormed(name);
        Integer existing = idsByName.get(name);
        if (existing != null) {
            if (!policies[existing].equals(policy)) {
                throw new IllegalArgumentException("tenant '" + name + "' is already registered with " + policies[existing]
                        + "; cannot re-register with " + policy);
            }
            return existing;
        }
        validator.validate(name, policy);
        int id = names.length;
        String[] n = Arrays.copyOf(names, id + 1);
        TenantPolicy[] p = Arrays.copyOf(policies, id + 1);
        n[id] = name;
        p[id] = policy;
        policies = p;
        names = n;
        idsByName.put(name, id);
        return id;
    }

    /**
     * Refuses a name two tenants could share once encoded: UTF-8 turns every unpaired surrogate into
     * {@code ?}, so "a\uD800" and "a?" would derive one key and read alike in logs and the audit
     * trail; control characters would forge log lines. The message names the offending position and
     * code point, never the raw character.
     */
    private static void checkWellFormed(String name) {
        for (int i = 0; i < name.length(); ) {
            int cp = name.codePointAt(i);
            if (Character.getType(cp) == Character.SURROGATE || Character.isISOControl(cp)) {
                throw new IllegalArgumentException("tenant name has " + (Character.isISOControl(cp) ? "a control character" : "an unpaired surrogate")
                        + " U+" + String.format("%04X", cp) + " at index " + i + " (of " + name.length() + " chars): names must be well-formed text");
            }
            i += Character.charCount(cp);
        }
    }

    public int register(String name) {
        return register(name, TenantPolicy.DEFAULT);
    }

    public synchronized int idOf(String name) {
        Integer id = idsByName.get(name);
        if (id == null) {
            throw new UnknownTenantException("unknown tenant '" + name + "' (" + names.length + " registered)");
        }
        return id;
    }

    /** Throws {@link UnknownTenantException} unless {@code tenant} is a registered id. */
    public void check(int tenant) {
        int count = names.length;
        if (tenant < 0 || tenant >= count) {
            throw new UnknownTenantException("unknown tenant id " + tenant + " (" + count + " registered)");
        }
    }

    public boolean isRegistered(int tenant) {
        return tenant >= 0 && tenant < names.length;
    }

    public String name(int tenant) {
        check(tenant);
        return names[tenant];
    }

    public TenantPolicy policy(int tenant) {
        check(tenant);
        return policies[tenant];
    }

    public int size() {
        return names.length;
    }
}
