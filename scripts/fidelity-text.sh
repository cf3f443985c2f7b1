#!/bin/sh
# Print the path of the fidelity text (issue 5: turbokv-lab kld, niah),
# making it first if needed: the English prose paragraphs of The Debian
# Administrator's Handbook (Debian package debian-handbook, installed by
# scripts/setup.sh), in reading order from the foreword (the title page's
# licence notices left out), code listings and tables left out,
# repeated paragraphs dropped, one blank line between paragraphs. Same
# package version, same bytes on every machine. About 150k words.
#
#   scripts/fidelity-text.sh            print the path (exit 1 if the
#                                       package is missing)
set -eu

src=/usr/share/doc/debian-handbook/html/en-US
out=${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/fidelity/debian-handbook.en.txt

if [ ! -s "$out" ]; then
	if [ ! -f "$src/index.html" ]; then
		echo "fidelity-text: $src missing: apt-get install debian-handbook (scripts/setup.sh)" >&2
		exit 1
	fi
	mkdir -p "$(dirname "$out")"
	python3 - "$src" >"$out.tmp" <<'PY'
import html.parser, os, re, sys

src = sys.argv[1]


class Links(html.parser.HTMLParser):
    """Pages in the order the table of contents links them."""

    def __init__(self):
        super().__init__()
        self.files = []

    def handle_starttag(self, tag, attrs):
        f = (dict(attrs).get('href') or '').split('#')[0]
        if tag == 'a' and f.endswith('.html') and '/' not in f and f not in self.files:
            self.files.append(f)


class Paras(html.parser.HTMLParser):
    """Text of <p> and <div class="para"> outside <pre>, tables and scripts."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.skip = 0
        self.buf = []
        self.out = []

    def handle_starttag(self, tag, attrs):
        if tag in ('pre', 'table', 'script', 'style'):
            self.skip += 1
        if tag == 'p' or (tag == 'div' and (('class', 'para') in attrs or self.depth)):
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in ('pre', 'table', 'script', 'style'):
            self.skip -= 1
        if tag in ('p', 'div') and self.depth:
            self.depth -= 1
            if not self.depth:
                p = re.sub(r'\s+', ' ', ''.join(self.buf)).strip()
                if len(p.split()) >= 8:
                    self.out.append(p)
                self.buf = []

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.buf.append(data)


links = Links()
with open(os.path.join(src, 'index.html'), encoding='utf-8') as f:
    links.feed(f.read())
seen = set()
for name in [f for f in links.files if f != 'index.html']:  # not its licence notices
    path = os.path.join(src, name)
    if not os.path.exists(path):
        continue
    paras = Paras()
    with open(path, encoding='utf-8') as f:
        paras.feed(f.read())
    for p in paras.out:
        if p not in seen:
            seen.add(p)
            sys.stdout.write(p + '\n\n')
PY
	mv "$out.tmp" "$out"
fi
echo "$out"
