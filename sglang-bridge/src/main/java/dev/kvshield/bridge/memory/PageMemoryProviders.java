package dev.kvshield.bridge.memory;

import java.util.ArrayList;
import java.util.List;
import java.util.ServiceLoader;

/** Looks up a {@link PageMemoryProvider} by name: the built-in CPU ones, then the class path's. */
public final class PageMemoryProviders {
    private PageMemoryProviders() {}

    /**
     * The provider called {@code name}.
     *
     * @throws IllegalArgumentException naming the backend and every provider that was found
     */
    public static PageMemoryProvider byName(String name) {
        List<String> found = new ArrayList<>();
        for (PageMemoryProvider p : List.of(new ExternalMemoryProvider(), new OffHeapMemoryProvider())) {
            if (p.name().equals(name)) {
                return p;
            }
            found.add(p.name());
        }
        for (PageMemoryProvider p : ServiceLoader.load(PageMemoryProvider.class, PageMemoryProviders.class.getClassLoader())) {
            if (p.name().equals(name)) {
                return p;
            }
            found.add(p.name());
        }
        throw new IllegalArgumentException("no page-memory backend \"" + name + "\"; found " + found
                + " (built-in, and META-INF/services/" + PageMemoryProvider.class.getName() + " on the class path)");
    }
}
