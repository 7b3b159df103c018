package dev.kvshield.tenant;

import dev.kvshield.protection.ProtectionLevel;

/**
 * Per-tenant settings: an optional page quota, an optional protection level that overrides the
 * pool's, and whether the tenant is regulated (regulated tenants always get
 * {@link ProtectionLevel#COMPLIANCE}).
 *
 * @param quotaPages most pages the tenant may own at once, or {@link #UNLIMITED}
 * @param levelOverride the tenant's level, or {@code null} for the pool default
 * @param regulated forces {@code COMPLIANCE} whatever the pool default or override
 */
public record TenantPolicy(int quotaPages, ProtectionLevel levelOverride, boolean regulated) {
    public static final int UNLIMITED = -1;
    public static final TenantPolicy DEFAULT = new TenantPolicy(UNLIMITED, null, false);

    public TenantPolicy {
        if (quotaPages < 0 && quotaPages != UNLIMITED) {
            throw new IllegalArgumentException("quotaPages must be >= 0 or UNLIMITED (-1): quotaPages=" + quotaPages);
        }
    }

    public static TenantPolicy withQuota(int quotaPages) {
        return new TenantPolicy(quotaPages, null, false);
    }

    public static TenantPolicy withLevel(ProtectionLevel level) {
        return new TenantPolicy(UNLIMITED, level, false);
    }

    public static TenantPolicy regulatedTenant() {
        return new TenantPolicy(UNLIMITED, ProtectionLevel.COMPLIANCE, true);
    }

    /** The level this tenant's pages get in a pool whose default is {@code poolDefault}. */
    public ProtectionLevel effectiveLevel(ProtectionLevel poolDefault) {
        if (regulated) {
            return ProtectionLevel.COMPLIANCE;
        }
        return levelOverride != null ? levelOverride : poolDefault;
    }
}
