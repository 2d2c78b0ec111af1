// The warm JVM of a pooled Java sandbox: runs under runners/supervisor.pl (started by the script in
// languages.py) before the program exists, so the JVM start and javac's warm-up are paid in the pool. Started
// either from the runner jar and class data archive that java_prepare.sh made in the Java store (with
// `--warm`: it then compiles a sample first, so that javac is warm when the program comes), or as
// `java Runner.java` through the source launcher, which compiles this file with javac and so warms it. It
// reads the program from stdin, names its file with java_scan.sh, compiles it in this JVM with javax.tools
// (javac's own messages and exit status; a failure ends stderr with the phase marker) and runs the main type
// from a fresh class loader, as `java` would: same exit status, same uncaught-exception report, without this
// runner's frames. Preview code (an implicitly declared class) needs a JVM started with --enable-preview: it
// falls back to java_run.sh. With `--train` (java_prepare.sh, while the archive is dumped) it compiles and
// runs the sample only. Prints nothing of its own.
import java.io.ByteArrayInputStream;
import java.io.OutputStream;
import java.io.PrintStream;
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
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

public class Runner {
    static final Path STATE = Path.of("/tmp/.llm-sandbox");
    static final Path CLASSES = Path.of("/tmp/classes");
    static final Path LIBS = Path.of("/opt/llm-sandbox/libs/java");
    static final String COMPILE_FAILED = "\u001ellm-sandbox-phase:compile\u001e\n";
    static final String SAMPLE = "import java.util.*;\n\npublic class Main {\n"
            + "    public static void main(String[] args) {\n"
            + "        List<String> words = new ArrayList<>(List.of(\"b\", \"a\"));\n"
            + "        Collections.sort(words);\n"
            + "        System.out.println(String.join(\",\", words) + words.size());\n    }\n}\n";

    public static void main(String[] args) throws Throwable {
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        List<String> options = Arrays.asList(args);
        if (options.contains("--train")) {
            warmUp(javac, true);
            return;
        }
        if (options.contains("--warm")) {
            warmUp(javac, false);
        }
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

    /** Compiles (and with `run`, loads and runs, output dropped) a sample in a directory of its own, removed after. */
    static void warmUp(JavaCompiler javac, boolean run) throws Exception {
        Path dir = Files.createTempDirectory(STATE, "warm");
        try {
            Path file = Files.writeString(dir.resolve("Main.java"), SAMPLE);
            OutputStream none = OutputStream.nullOutputStream();
            if (javac.run(null, none, none, "-encoding", "UTF-8", "-d", dir.toString(), file.toString()) == 0 && run) {
                ClassLoader loader = new URLClassLoader(new URL[] {dir.toUri().toURL()},
                        ClassLoader.getPlatformClassLoader());
                Method main = Class.forName("Main", false, loader).getMethod("main", String[].class);
                PrintStream out = System.out;
                System.setOut(new PrintStream(none));
                try {
                    main.invoke(null, (Object) new String[0]);
                } finally {
                    System.setOut(out);
                }
            }
        } finally {
            try (Stream<Path> entries = Files.walk(dir)) {
                for (Path entry : entries.sorted(Comparator.reverseOrder()).toList()) {
                    Files.deleteIfExists(entry);
                }
            }
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
