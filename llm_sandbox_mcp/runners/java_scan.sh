# Runs inside the sandbox as `sh -c <this file>` (followed by java_run.sh): the user's code arrives on stdin.
# The source is scanned (comments and strings skipped) for its package, its top-level types and the
# type declaring `static void main`; the file is named after the public top-level type (javac's rule),
# else after the main type, else Main.java. Further public top-level types would each need their own
# file, so their `public` is blanked in place (same line and column numbers). javac compiles into
# /tmp/classes (failure: phase marker), then java runs the main type. A snippet without any type and
# with a `void main()` is a Java 21 implicitly declared class (preview). Jars from the library cache
# are on the class path of both steps.
# This part scans and names the file; it leaves "file, main type, kind" one per line in $S/scan.
L=/opt/llm-sandbox/libs/java
S=/tmp/.llm-sandbox
mkdir -p "$S" /tmp/classes
cat > "$S/source.java" || exit 70
awk -v OUT="$S/scanned.java" '
function flush() { if (word != "") { tok[++nt] = word; tline[nt] = wline; tcol[nt] = wcol; word = "" } }
{ lines[NR] = $0 }
END {
  nt = 0; state = "code"; word = ""
  for (ln = 1; ln <= NR; ln++) {
    s = lines[ln]; n = length(s)
    for (i = 1; i <= n; i++) {
      c = substr(s, i, 1)
      if (state == "block") { if (c == "*" && substr(s, i + 1, 1) == "/") { state = "code"; i++ } continue }
      if (state == "text") { if (substr(s, i, 3) == "\"\"\"") { state = "code"; i += 2 } else if (c == "\\") i++; continue }
      if (state == "str") { if (c == "\\") i++; else if (c == q) state = "code"; continue }
      if (c ~ /[A-Za-z0-9_$]/ || c > "~") { if (word == "") { wline = ln; wcol = i } word = word c; continue }
      flush()
      if (c == "/" && substr(s, i + 1, 1) == "/") break
      if (c == "/" && substr(s, i + 1, 1) == "*") { state = "block"; i++; continue }
      if (substr(s, i, 3) == "\"\"\"") { state = "text"; i += 2; tok[++nt] = "\"\""; continue }
      if (c == "\"" || c == "\047") { state = "str"; q = c; tok[++nt] = "\"\""; continue }
      if (c ~ /[{}();.@=<>,]/) tok[++nt] = c
    }
    flush()
    if (state == "str") state = "code"
  }
  depth = 0; sp = 0; pub = 0; stat = 0; pending = ""; pkg = ""; first = ""; mainc = ""; npub = 0; mainfound = 0
  for (k = 1; k <= nt; k++) {
    t = tok[k]
    if (t == "package" && depth == 0 && pkg == "" && first == "") {
      for (j = k + 1; j <= nt && tok[j] != ";"; j++) pkg = pkg tok[j]
      k = j; continue
    }
    if (t == "{") {
      depth++
      if (pending != "") { sp++; sname[sp] = pending; sdepth[sp] = depth; pending = "" }
      pub = 0; stat = 0; continue
    }
    if (t == "}") { if (sp > 0 && sdepth[sp] == depth) sp--; depth--; pub = 0; stat = 0; continue }
    if (t == ";") { pub = 0; stat = 0; continue }
    if (t == "public") { pub = k; continue }
    if (t == "static") { stat = 1; continue }
    if ((t == "class" || t == "interface" || t == "enum" || t == "record") && tok[k - 1] != "." &&
        tok[k + 1] ~ /^[A-Za-z_$\200-\377]/) {
      if (t == "record" && tok[k + 2] != "(" && tok[k + 2] != "<") continue
      pending = tok[k + 1]
      if (sp == 0) {
        if (first == "") first = pending
        if (pub) { npub++; pubname[npub] = pending; pubtok[npub] = pub }
      }
      k++; continue
    }
    if (t == "main" && tok[k + 1] == "(" && tok[k - 1] == "void") {
      mainfound = 1
      if (stat && sp > 0 && mainc == "") { mainc = sname[1]; for (j = 2; j <= sp; j++) mainc = mainc "$" sname[j] }
    }
  }
  top = mainc; sub(/\$.*/, "", top)
  keep = ""
  for (j = 1; j <= npub; j++) if (pubname[j] == top) keep = top
  if (keep == "" && npub > 0) keep = pubname[1]
  for (j = 1; j <= npub; j++) if (pubname[j] != keep) {
    p = pubtok[j]; l = tline[p]; col = tcol[p]
    lines[l] = substr(lines[l], 1, col - 1) "      " substr(lines[l], col + 6)
  }
  for (ln = 1; ln <= NR; ln++) print lines[ln] > OUT
  file = keep != "" ? keep : (top != "" ? top : (first != "" ? first : "Main"))
  if (mainc == "") mainc = first != "" ? first : "Main"
  if (pkg != "") mainc = pkg "." mainc
  print file; print mainc; print (first == "" && mainfound) ? "implicit" : "classic"
}' "$S/source.java" > "$S/scan" || exit 70
{ read -r file; read -r main; read -r kind; } < "$S/scan"
mv "$S/scanned.java" "$file.java"
