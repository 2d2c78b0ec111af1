// Runs in the install sandbox (with network) as a single-file program (`java Resolve.java GAV...`):
// downloads each group:artifact:version jar and its compile- and runtime-scope dependencies, transitively,
// from the Maven repository in LLM_SANDBOX_MAVEN_REPO into /opt/llm-sandbox/libs/java, the directory the
// run puts on the class path. Like Maven: parent POMs and their properties, dependencyManagement with
// imported BOMs, exclusions, optional and test/provided dependencies skipped, the nearest version wins,
// version ranges resolved through maven-metadata.xml. Extra trusted certificates come from SSL_CERT_FILE.
import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509TrustManager;
import javax.xml.parsers.DocumentBuilderFactory;
import org.w3c.dom.Document;
import org.w3c.dom.Element;
import org.w3c.dom.Node;

public class Resolve {
    static final Path OUT = Path.of("/opt/llm-sandbox/libs/java");
    static final Pattern PROPERTY = Pattern.compile("\\$\\{([^}]+)\\}");
    // Coordinates become URL paths and file names: Maven's own characters only, no "..".
    static final Pattern SAFE = Pattern.compile("[A-Za-z0-9_][A-Za-z0-9_.+-]*|[\\[(][A-Za-z0-9_.,+-]*[\\])]");
    static String repo;
    static HttpClient http;
    static final Map<String, Pom> poms = new HashMap<>();

    record Dep(String group, String artifact, String version, String scope, String type, String classifier,
               boolean optional, Set<String> exclusions) {
        String key() {
            return group + ":" + artifact + ":" + type + ":" + classifier;
        }
    }

    /** A POM with its parents merged in and its properties expanded. */
    static final class Pom {
        String group;
        String artifact;
        String version;
        String packaging = "jar";
        final Map<String, String> properties = new HashMap<>();
        final Map<String, Dep> managed = new LinkedHashMap<>();
        final Map<String, Dep> dependencies = new LinkedHashMap<>();
    }

    public static void main(String[] args) throws Exception {
        repo = System.getenv().getOrDefault("LLM_SANDBOX_MAVEN_REPO", "").replaceAll("/+$", "");
        if (repo.isEmpty()) {
            fail("no Maven repository is configured: set SANDBOX_MAVEN_REPO to the URL of Maven Central or of "
                    + "your company's mirror");
        }
        http = HttpClient.newBuilder()
                .followRedirects(HttpClient.Redirect.NORMAL)
                .connectTimeout(Duration.ofSeconds(30))
                .sslContext(sslContext())
                .build();
        Files.createDirectories(OUT);
        ArrayDeque<Object[]> queue = new ArrayDeque<>();
        for (String spec : args) {
            String[] parts = spec.split(":");
            queue.add(new Object[] {new Dep(parts[0], parts[1], parts[2], "compile", "jar", "", false, Set.of()),
                    Set.<String>of()});
        }
        Set<String> chosen = new HashSet<>();
        while (!queue.isEmpty()) {
            Object[] item = queue.poll();
            Dep dep = (Dep) item[0];
            @SuppressWarnings("unchecked")
            Set<String> exclusions = (Set<String>) item[1];
            if (!chosen.add(dep.group() + ":" + dep.artifact() + ":" + dep.classifier())) {
                continue; // breadth first: the nearest declaration wins, as in Maven
            }
            for (String part : new String[] {dep.group(), dep.artifact(), dep.version(), dep.classifier()}) {
                if (!part.isEmpty() && !SAFE.matcher(part).matches()) {
                    fail("refusing a dependency with an unusual name: " + dep.group() + ":" + dep.artifact() + ":"
                            + dep.version());
                }
            }
            String version = resolveVersion(dep.group(), dep.artifact(), dep.version());
            Pom pom = pom(dep.group(), dep.artifact(), version);
            if (pom == null) {
                fail("not found in " + repo + ": " + dep.group() + ":" + dep.artifact() + ":" + version);
            }
            if (!dep.type().equals("pom") && !pom.packaging.equals("pom")) {
                download(dep.group(), dep.artifact(), version, dep.classifier());
            }
            Set<String> inherited = new HashSet<>(exclusions);
            inherited.addAll(dep.exclusions());
            for (Dep child : pom.dependencies.values()) {
                Dep managed = pom.managed.get(child.key());
                String scope = child.scope().isEmpty() && managed != null ? managed.scope() : child.scope();
                String childVersion = child.version().isEmpty() && managed != null ? managed.version() : child.version();
                if (!(scope.isEmpty() || scope.equals("compile") || scope.equals("runtime")) || child.optional()
                        || !(child.type().equals("jar") || child.type().equals("bundle"))
                        || excluded(inherited, child.group(), child.artifact())) {
                    continue;
                }
                if (childVersion.isEmpty()) {
                    fail("no version for " + child.group() + ":" + child.artifact() + " (needed by "
                            + dep.group() + ":" + dep.artifact() + ":" + version + ")");
                }
                Dep next = new Dep(child.group(), child.artifact(), childVersion, scope, "jar", child.classifier(),
                        false, child.exclusions());
                queue.add(new Object[] {next, inherited});
            }
        }
    }

    static boolean excluded(Set<String> exclusions, String group, String artifact) {
        return exclusions.contains(group + ":" + artifact) || exclusions.contains(group + ":*")
                || exclusions.contains("*:" + artifact) || exclusions.contains("*:*");
    }

    static void fail(String message) {
        System.err.println(message);
        System.exit(1);
    }

    static String path(String group, String artifact, String version) {
        return repo + "/" + group.replace('.', '/') + "/" + artifact + "/" + version + "/" + artifact + "-" + version;
    }

    static byte[] fetch(String url) throws Exception {
        HttpRequest request = HttpRequest.newBuilder(URI.create(url)).timeout(Duration.ofSeconds(120)).GET().build();
        HttpResponse<byte[]> response;
        try {
            response = http.send(request, HttpResponse.BodyHandlers.ofByteArray());
        } catch (java.io.IOException exc) {
            Throwable root = exc;
            while (root.getCause() != null) {
                root = root.getCause();
            }
            fail("GET " + url + " failed: " + exc + (root == exc ? "" : " (" + root + ")"));
            return null;
        }
        if (response.statusCode() == 404) {
            return null;
        }
        if (response.statusCode() != 200) {
            fail("GET " + url + ": HTTP " + response.statusCode());
        }
        return response.body();
    }

    static void download(String group, String artifact, String version, String classifier) throws Exception {
        String url = path(group, artifact, version) + (classifier.isEmpty() ? "" : "-" + classifier) + ".jar";
        byte[] jar = fetch(url);
        if (jar == null) {
            fail("not found: " + url);
        }
        String name = group + "__" + artifact + "-" + version + (classifier.isEmpty() ? "" : "-" + classifier);
        Files.write(OUT.resolve(name + ".jar"), jar);
        System.out.println("resolved " + group + ":" + artifact + ":" + version);
    }

    static Pom pom(String group, String artifact, String version) throws Exception {
        String key = group + ":" + artifact + ":" + version;
        if (poms.containsKey(key)) {
            return poms.get(key);
        }
        byte[] xml = fetch(path(group, artifact, version) + ".pom");
        if (xml == null) {
            poms.put(key, null);
            return null;
        }
        Element project = parse(xml);
        Pom pom = new Pom();
        Element parentElement = child(project, "parent");
        Pom parent = null;
        if (parentElement != null) {
            parent = pom(text(parentElement, "groupId"), text(parentElement, "artifactId"),
                    text(parentElement, "version"));
            if (parent == null) {
                fail("parent POM of " + key + " not found");
            }
            pom.properties.putAll(parent.properties);
            pom.managed.putAll(parent.managed);
            pom.dependencies.putAll(parent.dependencies);
        }
        pom.group = or(text(project, "groupId"), parent == null ? group : parent.group);
        pom.artifact = artifact;
        pom.version = or(text(project, "version"), parent == null ? version : parent.version);
        pom.packaging = or(text(project, "packaging"), "jar");
        Element properties = child(project, "properties");
        if (properties != null) {
            for (Element property : children(properties, null)) {
                pom.properties.put(property.getTagName(), property.getTextContent().trim());
            }
        }
        for (String prefix : new String[] {"project.", "pom.", ""}) {
            pom.properties.put(prefix + "groupId", pom.group);
            pom.properties.put(prefix + "artifactId", pom.artifact);
            pom.properties.put(prefix + "version", pom.version);
        }
        if (parent != null) {
            pom.properties.put("project.parent.version", parent.version);
            pom.properties.put("project.parent.groupId", parent.group);
        }
        Element management = child(project, "dependencyManagement");
        if (management != null) {
            for (Dep dep : dependencies(child(management, "dependencies"), pom.properties)) {
                if (dep.scope().equals("import") && dep.type().equals("pom")) {
                    Pom bom = pom(dep.group(), dep.artifact(), dep.version());
                    if (bom != null) {
                        bom.managed.forEach(pom.managed::putIfAbsent);
                    }
                } else {
                    pom.managed.put(dep.key(), dep);
                }
            }
        }
        for (Dep dep : dependencies(child(project, "dependencies"), pom.properties)) {
            pom.dependencies.put(dep.key(), dep);
        }
        poms.put(key, pom);
        return pom;
    }

    static List<Dep> dependencies(Element list, Map<String, String> properties) {
        List<Dep> result = new ArrayList<>();
        if (list == null) {
            return result;
        }
        for (Element dep : children(list, "dependency")) {
            Set<String> exclusions = new HashSet<>();
            Element excl = child(dep, "exclusions");
            if (excl != null) {
                for (Element e : children(excl, "exclusion")) {
                    exclusions.add(expand(text(e, "groupId"), properties) + ":" + expand(text(e, "artifactId"), properties));
                }
            }
            result.add(new Dep(
                    expand(text(dep, "groupId"), properties),
                    expand(text(dep, "artifactId"), properties),
                    expand(or(text(dep, "version"), ""), properties),
                    expand(or(text(dep, "scope"), ""), properties),
                    expand(or(text(dep, "type"), "jar"), properties),
                    expand(or(text(dep, "classifier"), ""), properties),
                    "true".equals(expand(or(text(dep, "optional"), "false"), properties)),
                    exclusions));
        }
        return result;
    }

    static String expand(String value, Map<String, String> properties) {
        for (int round = 0; round < 10 && value.contains("${"); round++) {
            Matcher matcher = PROPERTY.matcher(value);
            StringBuilder out = new StringBuilder();
            while (matcher.find()) {
                String replacement = properties.getOrDefault(matcher.group(1), matcher.group(0));
                matcher.appendReplacement(out, Matcher.quoteReplacement(replacement));
            }
            matcher.appendTail(out);
            value = out.toString();
        }
        return value;
    }

    /** A version, or the highest version the repository has within a range such as [1.2,2.0). */
    static String resolveVersion(String group, String artifact, String version) throws Exception {
        if (!(version.startsWith("[") || version.startsWith("("))) {
            return version;
        }
        byte[] xml = fetch(repo + "/" + group.replace('.', '/') + "/" + artifact + "/maven-metadata.xml");
        if (xml == null) {
            fail("no maven-metadata.xml for " + group + ":" + artifact + " to resolve " + version);
        }
        Element versioning = child(parse(xml), "versioning");
        String best = null;
        for (Element v : children(child(versioning, "versions"), "version")) {
            String candidate = v.getTextContent().trim();
            if (inRange(candidate, version) && (best == null || compare(candidate, best) > 0)) {
                best = candidate;
            }
        }
        if (best == null) {
            fail("no version of " + group + ":" + artifact + " in " + version);
        }
        return best;
    }

    static boolean inRange(String version, String range) {
        for (String part : range.split("(?<=[\\])]),")) {
            String body = part.substring(1, part.length() - 1);
            boolean lowInclusive = part.startsWith("[");
            boolean highInclusive = part.endsWith("]");
            String[] bounds = body.split(",", -1);
            String low = bounds[0].trim();
            String high = bounds.length > 1 ? bounds[1].trim() : low;
            boolean aboveLow = low.isEmpty() || (lowInclusive ? compare(version, low) >= 0 : compare(version, low) > 0);
            boolean belowHigh = high.isEmpty()
                    || (highInclusive ? compare(version, high) <= 0 : compare(version, high) < 0);
            if (aboveLow && belowHigh) {
                return true;
            }
        }
        return false;
    }

    static int compare(String a, String b) {
        String[] x = a.split("[.-]");
        String[] y = b.split("[.-]");
        for (int i = 0; i < Math.max(x.length, y.length); i++) {
            String p = i < x.length ? x[i] : "0";
            String q = i < y.length ? y[i] : "0";
            int c = p.matches("\\d+") && q.matches("\\d+") ? Long.compare(Long.parseLong(p), Long.parseLong(q))
                    : p.compareTo(q);
            if (c != 0) {
                return c;
            }
        }
        return 0;
    }

    static Element parse(byte[] xml) throws Exception {
        DocumentBuilderFactory factory = DocumentBuilderFactory.newInstance();
        factory.setFeature("http://apache.org/xml/features/disallow-doctype-decl", true);
        factory.setExpandEntityReferences(false);
        Document document = factory.newDocumentBuilder().parse(new ByteArrayInputStream(xml));
        return document.getDocumentElement();
    }

    static List<Element> children(Element parent, String tag) {
        List<Element> result = new ArrayList<>();
        if (parent == null) {
            return result;
        }
        for (Node node = parent.getFirstChild(); node != null; node = node.getNextSibling()) {
            if (node instanceof Element element && (tag == null || element.getTagName().equals(tag))) {
                result.add(element);
            }
        }
        return result;
    }

    static Element child(Element parent, String tag) {
        List<Element> found = children(parent, tag);
        return found.isEmpty() ? null : found.get(0);
    }

    static String text(Element parent, String tag) {
        Element element = child(parent, tag);
        return element == null ? null : element.getTextContent().trim();
    }

    static String or(String value, String fallback) {
        return value == null || value.isEmpty() ? fallback : value;
    }

    /** The JDK's trusted roots, plus the certificates in SSL_CERT_FILE (a TLS-inspecting proxy's CA). */
    static SSLContext sslContext() throws Exception {
        TrustManagerFactory defaults = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        defaults.init((KeyStore) null);
        List<X509TrustManager> managers = new ArrayList<>();
        for (TrustManager manager : defaults.getTrustManagers()) {
            if (manager instanceof X509TrustManager x509) {
                managers.add(x509);
            }
        }
        String bundle = System.getenv("SSL_CERT_FILE");
        if (bundle != null && Files.isReadable(Path.of(bundle))) {
            KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
            store.load(null, null);
            int index = 0;
            try (InputStream in = Files.newInputStream(Path.of(bundle))) {
                for (Certificate certificate : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                    store.setCertificateEntry("extra-" + index++, certificate);
                }
            }
            TrustManagerFactory extra = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            extra.init(store);
            for (TrustManager manager : extra.getTrustManagers()) {
                if (manager instanceof X509TrustManager x509) {
                    managers.add(x509);
                }
            }
        }
        X509TrustManager any = new X509TrustManager() {
            public void checkClientTrusted(X509Certificate[] chain, String authType) throws CertificateException {
                throw new CertificateException("client certificates are not used");
            }

            public void checkServerTrusted(X509Certificate[] chain, String authType) throws CertificateException {
                CertificateException last = new CertificateException("no trusted certificate");
                for (X509TrustManager manager : managers) {
                    try {
                        manager.checkServerTrusted(chain, authType);
                        return;
                    } catch (CertificateException exc) {
                        last = exc;
                    }
                }
                throw last;
            }

            public X509Certificate[] getAcceptedIssuers() {
                return managers.stream().flatMap(m -> java.util.Arrays.stream(m.getAcceptedIssuers()))
                        .toArray(X509Certificate[]::new);
            }
        };
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(null, new TrustManager[] {any}, null);
        return context;
    }
}
