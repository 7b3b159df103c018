package dev.kvshield.keys;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvshield.keys.cipher.ChaCha20;
import java.io.IOException;
import java.lang.reflect.Constructor;
import java.lang.reflect.Executable;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.Type;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.bouncycastle.crypto.params.KeyParameter;
import org.junit.jupiter.api.Test;
import org.opentest4j.AssertionFailedError;

/**
 * The module's public API: no Bouncy Castle type appears in any public or protected signature
 * outside {@code internal}, and key classes do not override {@code toString}, {@code equals} or
 * {@code hashCode}.
 */
class PublicApiTest {
    /** Every main class of this module outside internal packages. */
    private static List<Class<?>> publicApiClasses() throws IOException, URISyntaxException, ClassNotFoundException {
        Path root = Path.of(ChaCha20.class.getProtectionDomain().getCodeSource().getLocation().toURI());
        List<Class<?>> classes = new ArrayList<>();
        try (Stream<Path> files = Files.walk(root)) {
            for (Path f : files.filter(p -> p.toString().endsWith(".class")).toList()) {
                String name = root.relativize(f).toString().replace('/', '.').replaceAll("\\.class$", "");
                if (!name.contains(".internal.") && !name.endsWith("package-info")) {
                    classes.add(Class.forName(name, false, PublicApiTest.class.getClassLoader()));
                }
            }
        }
        return classes;
    }

    /** Fails naming the first public or protected member of {@code c} whose signature mentions Bouncy Castle. */
    static void assertNoBouncyCastleIn(Class<?> c) {
        if (!Modifier.isPublic(c.getModifiers())) {
            return;
        }
        List<String> found = new ArrayList<>();
        List<Executable> executables = new ArrayList<>(List.of(c.getDeclaredMethods()));
        executables.addAll(List.<Constructor<?>>of(c.getDeclaredConstructors()));
        for (Executable e : executables) {
            if (Modifier.isPublic(e.getModifiers()) || Modifier.isProtected(e.getModifiers())) {
                List<Type> types = new ArrayList<>(List.of(e.getGenericParameterTypes()));
                types.addAll(List.of(e.getGenericExceptionTypes()));
                if (e instanceof Method m) {
                    types.add(m.getGenericReturnType());
                }
                types.stream().filter(t -> t.getTypeName().contains("org.bouncycastle")).forEach(t -> found.add(e + " uses " + t));
            }
        }
        for (Field f : c.getDeclaredFields()) {
            if ((Modifier.isPublic(f.getModifiers()) || Modifier.isProtected(f.getModifiers()))
                    && f.getGenericType().getTypeName().contains("org.bouncycastle")) {
                found.add(f + " is a Bouncy Castle type");
            }
        }
        if (c.getSuperclass() != null && c.getSuperclass().getName().startsWith("org.bouncycastle")) {
            found.add(c + " extends " + c.getSuperclass());
        }
        assertEquals(List.of(), found, c.getName());
    }

    @Test
    void noBouncyCastleTypeInThePublicApi() throws Exception {
        List<Class<?>> classes = publicApiClasses();
        assertTrue(classes.contains(TenantKeyring.class) && classes.contains(ChaCha20.class), classes.toString());
        for (Class<?> c : classes) {
            assertNoBouncyCastleIn(c);
        }
    }

    /** Planted bug: a public method that returns a Bouncy Castle key parameter. */
    public static final class LeakyApi {
        public KeyParameter keyParameter() {
            return null;
        }
    }

    @Test
    void plantedBugAPublicBouncyCastleTypeIsFound() {
        assertThrows(AssertionFailedError.class, () -> assertNoBouncyCastleIn(LeakyApi.class));
    }

    @Test
    void keyClassesNeitherPrintNorCompareKeys() throws Exception {
        for (Class<?> c : List.of(RootKey.class, TenantKeyring.class)) {
            for (String method : List.of("toString", "hashCode")) {
                assertEquals(Object.class, c.getMethod(method).getDeclaringClass(), c + "." + method);
            }
            assertEquals(Object.class, c.getMethod("equals", Object.class).getDeclaringClass(), c + ".equals");
        }
    }
}
