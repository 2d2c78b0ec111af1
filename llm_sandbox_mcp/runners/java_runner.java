// The warm JVM of a pooled Java sandbox: runs under runners/supervisor.pl as `java Runner.java` (written by
// the script in languages.py) before the program exists, so the JVM start and javac's warm-up (the source
// launcher compiles this file with it) are paid in the pool. It reads the program from stdin, names its
// file with java_scan.sh, compiles it in this JVM with javax.tools (javac's own messages and exit status; a
// failure ends stderr with the phase marker) and runs the main type from a fresh class loader, as `java`
// would: same exit status, same uncaught-exception report, without this runner's frames. Preview code (an
// implicitly declared class) needs a JVM started with --enable-preview: it falls back to java_run.sh.
// Prints nothing of its own.
import java.io.ByteArrayInputStream;
import java.io.OutputStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

public class Runner {
    static final Path STATE = Path.of("/tmp/.llm-sandbox");
    static final Path CLASSES = Path.of("/tmp/classes");
    static final Path LIBS = Path.of("/opt/llm-sandbox/libs/java");
    static final String COMPILE_FAILED = "\u001ellm-sandbox-phase:compile\u001e\n";

    public static void main(String[] args) throws Throwable {
        // Already warm: the source launcher compiled this runner with it.
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        byte[] source = System.in.readAllBytes();
        System.setIn(new ByteArrayInputStream(new byte[0]));
        Files.write(STATE.resolve("program.java"), source);
        Process scan = new ProcessBuilder("sh", STATE.resolve("scan.sh").toString())
                .redirectInput(STATE.resolve("program.java").toFile())
                .redirectError(ProcessBuilder.Redirect.INHERIT)
                .start();
        scan.getInputStream().transferTo(OutputStream.nullOutputStream());
        if (scan.waitFor() != 0) {
            System.exit(70);
        }
        List<String> found = Files.readAllLines(STATE.resolve("scan"), StandardCharsets.UTF_8);
        if (found.size() < 3) {
            System.exit(70);
        }
        String file = found.get(0), mainType = found.get(1), kind = found.get(2);
        if (kind.equals("implicit")) {
            Process cold = new ProcessBuilder("sh", STATE.resolve("run.sh").toString()).inheritIO().start();
            System.exit(cold.waitFor());
        }
        List<Path> jars = libraryJars();
        StringBuilder classPath = new StringBuilder(CLASSES.toString());
        for (Path jar : jars) {
            classPath.append(':').append(jar);
        }
        Files.createDirectories(CLASSES);
        int status = javac.run(null, System.out, System.err,
                "-encoding", "UTF-8", "-cp", classPath.toString(), "-d", CLASSES.toString(), file + ".java");
        if (status != 0) {
            System.err.print(COMPILE_FAILED);
            System.err.flush();
            System.exit(status);
        }
        List<URL> urls = new ArrayList<>();
        urls.add(CLASSES.toUri().toURL());
        for (Path jar : jars) {
            urls.add(jar.toUri().toURL());
        }
        ClassLoader loader = new URLClassLoader(urls.toArray(new URL[0]), ClassLoader.getPlatformClassLoader());
        Thread.currentThread().setContextClassLoader(loader);
        Class<?> type = Class.forName(mainType, false, loader);
        Method main;
        try {
            main = type.getMethod("main", String[].class);
        } catch (NoSuchMethodException e) {
            main = null;
        }
        if (main == null || !Modifier.isStatic(main.getModifiers()) || main.getReturnType() != void.class) {
            System.err.println("Error: Main method not found in class " + mainType
                    + ", please define the main method as:\n   public static void main(String[] args)");
            System.exit(1);
        }
        main.setAccessible(true);  // the class need not be public, as with `java`
        try {
            main.invoke(null, (Object) new String[0]);
        } catch (InvocationTargetException e) {
            // As `java` reports it, ending at the user's main, and once the program's other threads are done.
            Throwable cause = e.getCause();
            StackTraceElement[] trace = cause.getStackTrace();
            int end = trace.length;
            for (int i = 0; i < trace.length; i++) {
                String name = trace[i].getClassName();
                if (name.startsWith("jdk.internal.reflect.") || name.startsWith("java.lang.reflect.")) {
                    end = i;
                    break;
                }
            }
            cause.setStackTrace(Arrays.copyOf(trace, end));
            System.err.print("Exception in thread \"main\" ");
            cause.printStackTrace();
            System.err.flush();
            for (Thread thread : Thread.getAllStackTraces().keySet()) {
                if (thread != Thread.currentThread() && !thread.isDaemon()) {
                    thread.join();
                }
            }
            System.exit(1);
        }
    }

    static List<Path> libraryJars() throws Exception {
        if (!Files.isDirectory(LIBS)) {
            return List.of();
        }
        try (Stream<Path> entries = Files.list(LIBS)) {
            return entries.filter(p -> p.toString().endsWith(".jar")).sorted().toList();
        }
    }
}
