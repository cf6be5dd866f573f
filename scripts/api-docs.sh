#!/usr/bin/env bash
# Builds the API reference (Doxygen over the installed headers, configured by docs/api) and fails
# when a public class, function, member or enumerator has no contract comment, or a comment is
# malformed: the `docs` target and the api_docs test both run it.
#   scripts/api-docs.sh BUILD/docs/api/Doxyfile
# Exit 0 when the reference is complete (HTML in docs/api/html beside the Doxyfile), 1 with every
# problem listed, 77 (SKIPPED) without doxygen.
set -euo pipefail
doxyfile=$1
out=$(dirname "$doxyfile")
root=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v doxygen >/dev/null; then
  echo "SKIPPED: doxygen not installed (scripts/install-deps.sh installs it)"
  exit 77
fi

log=$out/warnings.log
rm -rf "$out/html" "$out/xml"
# The XML is for the enumerator check below: Doxygen 1.9.4 does not warn about undocumented
# enumerators, so they are read from its XML output (the Doxyfile itself asks for HTML only).
status=0
{ cat "$doxyfile"; echo "GENERATE_XML = YES"; } | doxygen - 2>"$log" >/dev/null || status=$?

if command -v python3 >/dev/null; then
  python3 - "$out/xml" "$root" >>"$log" <<'EOF' || status=1
import glob, os, re, sys, xml.etree.ElementTree as ET
seen, bad = set(), 0
for path in sorted(glob.glob(sys.argv[1] + "/*.xml")):
    for enum in ET.parse(path).iter("memberdef"):
        if enum.get("kind") != "enum" or enum.get("prot") != "public" or enum.get("id") in seen:
            continue
        seen.add(enum.get("id"))
        loc = enum.find("location")
        path, line = os.path.join(sys.argv[2], loc.get("file")), int(loc.get("line"))
        source = open(path).read().split("\n")
        for value in enum.iter("enumvalue"):
            text = "".join(value.find("briefdescription").itertext())
            text += "".join(value.find("detaileddescription").itertext())
            if not text.strip():
                name = value.findtext("name")
                # The enumerator's own line: its first mention from the enum's line on.
                at = next((i + 1 for i in range(line - 1, len(source))
                           if re.search(rf"\b{name}\b", source[i])), line)
                print(f"{path}:{at}: error: Enumerator {name} of enum "
                      f"{enum.findtext('qualifiedname')} is not documented.")
                bad += 1
sys.exit(1 if bad else 0)
EOF
else
  echo "SKIPPED: python3 not installed: enumerators not checked for documentation"
fi

if ((status != 0)) || [[ -s $log ]]; then
  echo "api-docs: $(sort -u "$log" | grep -c .) problem(s) in the public headers' documentation" \
    "(every public declaration needs a contract comment: docs/api/mainpage.md says what it holds):"
  sort -u "$log"
  exit 1
fi
echo "api-docs: every public declaration is documented; $out/html/index.html"
