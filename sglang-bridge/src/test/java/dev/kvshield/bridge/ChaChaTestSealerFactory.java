package dev.kvshield.bridge;

import dev.kvshield.keys.HostPageSealerFactory;
import dev.kvshield.keys.RootKeySource;
import dev.kvshield.protection.PageSealer;
import dev.kvshield.protection.PageSealerFactory;

/**
 * tenant-keys' ChaCha20 sealer over an ephemeral root key, loadable by class name
 * ({@code sealerFactory}) for the bridge's reclaim benchmark; production names a factory bound to
 * the operator's root key source.
 */
public final class ChaChaTestSealerFactory implements PageSealerFactory {
    private final HostPageSealerFactory delegate = new HostPageSealerFactory(RootKeySource.ephemeral());

    @Override
    public PageSealer create(Context context) {
        return delegate.create(context);
    }
}
